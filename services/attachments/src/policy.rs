//! SigV4 POST policies: a browser uploads straight to S3 with a form that can only put exactly
//! the object we decided (bucket, key, size, Content-Type, and the SHA-256 when declared),
//! before a short expiry.

use std::time::{Duration, SystemTime};

use aws_sigv4::sign::v4::{calculate_signature, generate_signing_key};
use base64::Engine as _;
use chrono::{DateTime, Utc};
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Map, Value, json};

/// Credentials and place of the bucket the policy is for, and where download links point.
#[derive(Debug, Clone)]
pub struct Signer {
    /// Access key id.
    pub access_key: String,
    /// Secret access key (`Debug` shows it redacted).
    pub secret_key: SecretString,
    /// Signing region.
    pub region: String,
    /// Base URL browsers reach S3 at (path style: the form posts to `<base>/<bucket>`).
    pub public_endpoint: String,
    /// Base URL browsers reach this service at: download links are
    /// `<base>/v2/files/content/{fileId}?expires=&signature=`, keyed from `secret_key`.
    pub download_base: String,
}

/// What one upload may be.
#[derive(Debug, Clone)]
pub struct Upload<'a> {
    /// Bucket.
    pub bucket: &'a str,
    /// The exact object key.
    pub key: &'a str,
    /// The exact Content-Type.
    pub content_type: &'a str,
    /// The exact size in bytes.
    pub size: u64,
    /// SHA-256 the stored bytes must have, when the client declared one.
    pub sha256: Option<[u8; 32]>,
}

/// A signed form: where to POST and the fields to send before the file.
#[derive(Debug, Clone, PartialEq)]
pub struct SignedForm {
    /// URL to POST the multipart form to.
    pub url: String,
    /// Form fields, in order.
    pub fields: Map<String, Value>,
}

impl Signer {
    /// Signs a POST policy for `upload`, valid for `ttl` from `now`.
    pub fn sign(&self, upload: &Upload<'_>, now: DateTime<Utc>, ttl: Duration) -> SignedForm {
        let date = now.format("%Y%m%d").to_string();
        let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
        let credential = format!("{}/{date}/{}/s3/aws4_request", self.access_key, self.region);
        let expiration = (now
            + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::minutes(5)))
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string();
        let mut fields = Map::new();
        fields.insert("key".to_owned(), json!(upload.key));
        fields.insert("Content-Type".to_owned(), json!(upload.content_type));
        let mut conditions = vec![
            json!({"bucket": upload.bucket}),
            json!({"key": upload.key}),
            json!({"Content-Type": upload.content_type}),
            json!(["content-length-range", upload.size, upload.size]),
        ];
        if let Some(sha256) = upload.sha256 {
            let encoded = base64::engine::general_purpose::STANDARD.encode(sha256);
            fields.insert("x-amz-checksum-algorithm".to_owned(), json!("SHA256"));
            fields.insert("x-amz-checksum-sha256".to_owned(), json!(encoded));
            conditions.push(json!({"x-amz-checksum-algorithm": "SHA256"}));
            conditions.push(json!({"x-amz-checksum-sha256": encoded}));
        }
        for (name, value) in [
            ("x-amz-algorithm", "AWS4-HMAC-SHA256"),
            ("x-amz-credential", credential.as_str()),
            ("x-amz-date", amz_date.as_str()),
        ] {
            conditions.push(json!({ name: value }));
            fields.insert(name.to_owned(), json!(value));
        }
        let policy = json!({"expiration": expiration, "conditions": conditions});
        let encoded = base64::engine::general_purpose::STANDARD.encode(policy.to_string());
        let signing_key = generate_signing_key(
            self.secret_key.expose_secret(),
            SystemTime::from(now),
            &self.region,
            "s3",
        );
        let signature = calculate_signature(signing_key, encoded.as_bytes());
        fields.insert("policy".to_owned(), json!(encoded));
        fields.insert("x-amz-signature".to_owned(), json!(signature));
        SignedForm {
            url: format!(
                "{}/{}",
                self.public_endpoint.trim_end_matches('/'),
                upload.bucket
            ),
            fields,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> Signer {
        Signer {
            access_key: "AKID".to_owned(),
            secret_key: SecretString::from("secret"),
            region: "us-east-1".to_owned(),
            public_endpoint: "http://127.0.0.1:9000/".to_owned(),
            download_base: "http://127.0.0.1:8081".to_owned(),
        }
    }

    #[test]
    fn the_secret_key_never_shows_in_debug_output() {
        let shown = format!("{:?}", signer());
        assert!(!shown.contains("secret\""), "{shown}");
        assert!(shown.contains("REDACTED"), "{shown}");
    }

    fn decoded_policy(form: &SignedForm) -> Value {
        let encoded = form.fields["policy"].as_str().unwrap_or_default();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap_or_default();
        serde_json::from_slice(&bytes).unwrap_or_default()
    }

    #[test]
    fn the_policy_pins_bucket_key_type_exact_size_and_expiry() {
        let now = DateTime::parse_from_rfc3339("2026-11-22T08:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let upload = Upload {
            bucket: "b",
            key: "uploads/x/a.pdf",
            content_type: "application/pdf",
            size: 42,
            sha256: None,
        };
        let form = signer().sign(&upload, now, Duration::from_secs(300));
        assert_eq!(form.url, "http://127.0.0.1:9000/b");
        let policy = decoded_policy(&form);
        assert_eq!(policy["expiration"], "2026-11-22T08:05:00.000Z");
        let conditions = policy["conditions"].as_array().cloned().unwrap_or_default();
        for expected in [
            json!({"bucket": "b"}),
            json!({"key": "uploads/x/a.pdf"}),
            json!({"Content-Type": "application/pdf"}),
            json!(["content-length-range", 42, 42]),
            json!({"x-amz-credential": "AKID/20261122/us-east-1/s3/aws4_request"}),
        ] {
            assert!(
                conditions.contains(&expected),
                "{expected} in {conditions:?}"
            );
        }
        assert_eq!(
            form.fields["x-amz-signature"].as_str().map(str::len),
            Some(64)
        );
        assert!(!form.fields.contains_key("x-amz-checksum-sha256"));
    }

    #[test]
    fn a_declared_hash_is_pinned_as_the_s3_checksum() {
        let now = Utc::now();
        let upload = Upload {
            bucket: "b",
            key: "k",
            content_type: "text/plain",
            size: 1,
            sha256: Some([0u8; 32]),
        };
        let form = signer().sign(&upload, now, Duration::from_secs(60));
        let b64 = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        assert_eq!(form.fields["x-amz-checksum-sha256"], b64);
        assert!(
            decoded_policy(&form)["conditions"]
                .as_array()
                .is_some_and(|c| c.contains(&json!({"x-amz-checksum-sha256": b64})))
        );
    }
}
