//! The one JSON error envelope every service answers with.

use serde::{Deserialize, Serialize};

/// Stable, machine-readable error codes. The HTTP status is chosen by the service; the code
/// says what kind of problem it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request body or a parameter broke a rule (400/422).
    InvalidRequest,
    /// The request body is larger than the endpoint accepts (413).
    PayloadTooLarge,
    /// The content type is not one the endpoint accepts (415).
    UnsupportedMediaType,
    /// No valid bearer token was presented (401).
    Unauthorized,
    /// The resource does not exist or belongs to someone else (404).
    NotFound,
    /// The caller is authenticated but may not do this (403).
    Forbidden,
    /// The request conflicts with the current state of the resource (409).
    Conflict,
    /// The caller sent too many requests (429).
    RateLimited,
    /// The caller's storage quota is used up (403).
    QuotaExceeded,
    /// The caller's token budget (per day or per month) is spent (429, with `Retry-After`).
    BudgetExceeded,
    /// What was asked for is older than its retention (410).
    Expired,
    /// A dependency (database, NATS, S3) is unavailable (503).
    Unavailable,
    /// Something failed on our side; details are in the logs, never in the answer (500).
    Internal,
}

/// The body of every error answer: `{"error": {"code", "message", "field"?}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorEnvelope {
    /// The error itself.
    pub error: ErrorBody,
}

/// What went wrong, safe to show to the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Machine-readable kind of error.
    pub code: ErrorCode,
    /// Human-readable message; the seed's exact string where the seed defines one.
    pub message: String,
    /// The offending input as a JSON pointer (`/messages/0/content`) or parameter name.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub field: Option<String>,
}

impl ErrorEnvelope {
    /// Builds an envelope without a field.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error: ErrorBody {
                code,
                message: message.into(),
                field: None,
            },
        }
    }

    /// Builds an envelope that names the offending field.
    pub fn with_field(
        code: ErrorCode,
        message: impl Into<String>,
        field: impl Into<String>,
    ) -> Self {
        Self {
            error: ErrorBody {
                code,
                message: message.into(),
                field: Some(field.into()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_omits_an_absent_field_and_names_a_present_one() {
        let plain = serde_json::to_value(ErrorEnvelope::new(ErrorCode::NotFound, "run not found"))
            .unwrap_or_default();
        assert_eq!(
            plain,
            serde_json::json!({"error": {"code": "not_found", "message": "run not found"}})
        );
        let with_field = serde_json::to_value(ErrorEnvelope::with_field(
            ErrorCode::InvalidRequest,
            "threadId must be a valid UUID",
            "/threadId",
        ))
        .unwrap_or_default();
        assert_eq!(with_field["error"]["field"], "/threadId");
    }
}
