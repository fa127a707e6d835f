//! Bearer-JWT authentication: the token's `sub` is the owner of every thread, run and file.
//!
//! The algorithm is pinned by configuration (HS256 with a shared secret for local use, RS256
//! with a public key for deployments); a token signed any other way is refused (`none`
//! included), and so is one without `exp` or `sub`, past its expiry or before its `nbf`. When an
//! issuer or audience is configured the claim is required and must match; in production
//! (`SB_ENV=production`) both must be configured or the service does not start.

use std::str::FromStr;
use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode};
use protocol::ErrorCode;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::http::ErrorResponse;

/// The scope (in a token's `scope` claim: space-separated, or a list) that lets a caller read
/// every owner's usage (`GET /api/v1/agent/usage?owner=`).
pub const ADMIN_SCOPE: &str = "switchboard:admin";

/// Longest owner id accepted from a token's `sub`.
pub const MAX_SUB_LEN: usize = 255;

/// The signing algorithm a deployment accepts; exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtAlgorithm {
    /// HMAC-SHA256 with a shared secret (local use).
    Hs256,
    /// RSA-SHA256 verified with a public key (deployments).
    Rs256,
}

impl FromStr for JwtAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "HS256" => Ok(Self::Hs256),
            "RS256" => Ok(Self::Rs256),
            other => Err(format!("{other:?} is not supported; use HS256 or RS256")),
        }
    }
}

/// Authentication settings.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The one accepted algorithm.
    pub algorithm: JwtAlgorithm,
    /// HS256 secret, or RS256 public key in PEM.
    pub key: SecretString,
    /// Required `iss`, if set.
    pub issuer: Option<String>,
    /// Required `aud`, if set.
    pub audience: Option<String>,
}

/// A key that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot use the configured key: {0}")]
pub struct KeyError(String);

/// Verifies bearer tokens.
#[derive(Clone)]
pub struct Authenticator {
    key: DecodingKey,
    validation: Validation,
    verified: Arc<VerifiedTokens>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    /// OAuth scopes: one space-separated string, or a list.
    #[serde(default)]
    scope: Option<Scopes>,
    /// Required and checked by `jsonwebtoken`; read here to know how long the token may be
    /// remembered as verified.
    #[serde(default)]
    exp: Option<f64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Scopes {
    Text(String),
    List(Vec<String>),
}

impl Scopes {
    fn has(&self, wanted: &str) -> bool {
        match self {
            Self::Text(text) => text.split_ascii_whitespace().any(|s| s == wanted),
            Self::List(list) => list.iter().any(|s| s == wanted),
        }
    }
}

/// An authenticated caller: the owner it acts as, and whether its token grants
/// [`ADMIN_SCOPE`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The token's `sub`.
    pub owner: Owner,
    /// The token's scopes hold [`ADMIN_SCOPE`].
    pub admin: bool,
}

/// Tokens this process verified, each with its owner, until its expiry (plus the leeway the
/// verification allows): a client sends the same token with every request, and checking its
/// signature and claims again (HMAC or RSA, base64, two JSON parses) was 8 % of an accepted
/// run's CPU (BENCHMARKS.md section 2). A token is found by its exact text, so a changed byte
/// is verified afresh; at most [`VerifiedTokens::MAX`] tokens of at most
/// [`VerifiedTokens::MAX_TOKEN_LEN`] bytes are held (then the expired ones are dropped, or all).
#[derive(Default)]
struct VerifiedTokens {
    tokens: std::sync::Mutex<std::collections::HashMap<Box<str>, (Identity, u64)>>,
}

impl VerifiedTokens {
    const MAX: usize = 4096;
    const MAX_TOKEN_LEN: usize = 2048;

    /// The owner of `token` if it was verified and is still valid at `now` (Unix seconds).
    fn get(&self, token: &str, now: u64) -> Option<Identity> {
        let tokens = self.tokens.lock().ok()?;
        let (owner, until) = tokens.get(token)?;
        (now <= *until).then(|| owner.clone())
    }

    /// Remembers `token` as `owner`'s until `until` (Unix seconds).
    fn insert(&self, token: &str, owner: &Identity, until: u64, now: u64) {
        if token.len() > Self::MAX_TOKEN_LEN {
            return;
        }
        let Ok(mut tokens) = self.tokens.lock() else {
            return;
        };
        if tokens.len() >= Self::MAX {
            tokens.retain(|_, (_, until)| now <= *until);
            if tokens.len() >= Self::MAX {
                tokens.clear();
            }
        }
        tokens.insert(token.into(), (owner.clone(), until));
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Why a request is not authenticated. Never shown in detail to the caller.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    #[error("missing bearer token")]
    Missing,
    /// The token is malformed, badly signed, expired or lacks a usable `sub`.
    #[error("invalid bearer token: {0}")]
    Invalid(String),
}

impl Authenticator {
    /// Builds a verifier from settings.
    pub fn new(config: &AuthConfig) -> Result<Self, KeyError> {
        let secret = config.key.expose_secret();
        let (key, algorithm) = match config.algorithm {
            JwtAlgorithm::Hs256 => {
                if secret.len() < 32 {
                    return Err(KeyError(
                        "an HS256 secret needs at least 32 bytes".to_owned(),
                    ));
                }
                (
                    DecodingKey::from_secret(secret.as_bytes()),
                    Algorithm::HS256,
                )
            }
            JwtAlgorithm::Rs256 => (
                DecodingKey::from_rsa_pem(secret.as_bytes())
                    .map_err(|e| KeyError(e.to_string()))?,
                Algorithm::RS256,
            ),
        };
        let mut validation = Validation::new(algorithm);
        let mut required = vec!["exp", "sub"];
        if config.audience.is_some() {
            required.push("aud");
        }
        if config.issuer.is_some() {
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        validation.leeway = 30;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        match &config.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        if let Some(iss) = &config.issuer {
            validation.set_issuer(&[iss]);
        }
        Ok(Self {
            key,
            validation,
            verified: Arc::default(),
        })
    }

    /// The owner named by a token, if the token is valid.
    pub fn verify(&self, token: &str) -> Result<Owner, AuthError> {
        self.identify(token).map(|identity| identity.owner)
    }

    /// The caller a token names (owner and scopes), if the token is valid.
    pub fn identify(&self, token: &str) -> Result<Identity, AuthError> {
        let now = unix_now();
        if let Some(owner) = self.verified.get(token, now) {
            return Ok(owner);
        }
        let data = decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|e| AuthError::Invalid(e.to_string()))?;
        let Claims { sub, scope, exp } = data.claims;
        if sub.is_empty() || sub.len() > MAX_SUB_LEN || sub.chars().any(char::is_control) {
            return Err(AuthError::Invalid("unusable sub claim".to_owned()));
        }
        let owner = Identity {
            owner: Owner(sub),
            admin: scope.is_some_and(|scope| scope.has(ADMIN_SCOPE)),
        };
        // Valid until `exp + leeway` (jsonwebtoken's rule); `nbf`, checked now, stays passed.
        if let Some(exp) = exp.filter(|exp| exp.is_finite() && *exp >= 0.0) {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a finite, non-negative number of seconds, floored"
            )]
            let until = (exp.floor() as u64).saturating_add(self.validation.leeway);
            self.verified.insert(token, &owner, until, now);
        }
        Ok(owner)
    }

    /// The owner of a request with an `Authorization` header value.
    pub fn verify_header(&self, value: Option<&str>) -> Result<Owner, AuthError> {
        self.identify_header(value).map(|identity| identity.owner)
    }

    /// The caller of a request with an `Authorization` header value.
    pub fn identify_header(&self, value: Option<&str>) -> Result<Identity, AuthError> {
        let value = value.ok_or(AuthError::Missing)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(AuthError::Missing)?;
        self.identify(token.trim())
    }
}

/// The authenticated caller: the `sub` of a valid bearer token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner(pub String);

impl Owner {
    /// The owner id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<S> FromRequestParts<S> for Owner
where
    Arc<Authenticator>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ErrorResponse;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Identity::from_request_parts(parts, state)
            .await
            .map(|identity| identity.owner)
    }
}

impl<S> FromRequestParts<S> for Identity
where
    Arc<Authenticator>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ErrorResponse;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let auth = Arc::<Authenticator>::from_ref(state);
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        auth.identify_header(header).map_err(|err| {
            tracing::debug!(error = %err, "request refused: not authenticated");
            ErrorResponse::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                "a valid bearer token is required",
            )
            .with_header(header::WWW_AUTHENTICATE, "Bearer")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn authenticator() -> Authenticator {
        Authenticator::new(&AuthConfig {
            algorithm: JwtAlgorithm::Hs256,
            key: SecretString::from(SECRET),
            issuer: None,
            audience: None,
        })
        .unwrap()
    }

    fn token(alg: Algorithm, claims: serde_json::Value) -> String {
        encode(
            &Header::new(alg),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap()
    }

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default()
    }

    #[test]
    fn a_valid_token_names_its_sub_as_owner() {
        let t = token(Algorithm::HS256, json!({"sub": "alice", "exp": now() + 60}));
        assert_eq!(authenticator().verify(&t), Ok(Owner("alice".to_owned())));
    }

    #[test]
    fn the_admin_scope_is_read_from_a_scope_string_or_list_and_nothing_else() {
        let auth = authenticator();
        let admin = |claims: serde_json::Value| {
            let mut claims = claims;
            claims["sub"] = json!("alice");
            claims["exp"] = json!(now() + 60);
            auth.identify(&token(Algorithm::HS256, claims))
                .unwrap()
                .admin
        };
        assert!(admin(json!({"scope": "openid switchboard:admin"})));
        assert!(admin(json!({"scope": ["switchboard:admin"]})));
        assert!(!admin(json!({"scope": "openid switchboard:admins"})));
        assert!(!admin(json!({"scope": "switchboard:admin-ish"})));
        assert!(!admin(json!({"scp": "switchboard:admin"})));
        assert!(!admin(json!({})));
    }

    #[test]
    fn an_expired_token_is_refused() {
        let t = token(
            Algorithm::HS256,
            json!({"sub": "alice", "exp": now() - 120}),
        );
        assert!(authenticator().verify(&t).is_err());
    }

    #[test]
    fn a_token_signed_with_another_algorithm_is_refused() {
        let t = token(Algorithm::HS512, json!({"sub": "alice", "exp": now() + 60}));
        assert!(authenticator().verify(&t).is_err());
    }

    #[test]
    fn a_token_without_sub_or_exp_is_refused() {
        let no_sub = token(Algorithm::HS256, json!({"exp": now() + 60}));
        let no_exp = token(Algorithm::HS256, json!({"sub": "alice"}));
        assert!(authenticator().verify(&no_sub).is_err());
        assert!(authenticator().verify(&no_exp).is_err());
    }

    #[test]
    fn a_header_without_the_bearer_scheme_is_missing() {
        assert_eq!(
            authenticator().verify_header(Some("Basic abc")),
            Err(AuthError::Missing)
        );
        assert_eq!(authenticator().verify_header(None), Err(AuthError::Missing));
    }

    #[test]
    fn a_token_not_valid_yet_is_refused() {
        let t = token(
            Algorithm::HS256,
            json!({"sub": "alice", "exp": now() + 600, "nbf": now() + 300}),
        );
        assert!(authenticator().verify(&t).is_err());
        let t = token(
            Algorithm::HS256,
            json!({"sub": "alice", "exp": now() + 600, "nbf": now() - 10}),
        );
        assert!(authenticator().verify(&t).is_ok());
    }

    #[test]
    fn a_configured_audience_and_issuer_are_required_and_must_match() {
        let strict = Authenticator::new(&AuthConfig {
            algorithm: JwtAlgorithm::Hs256,
            key: SecretString::from(SECRET),
            issuer: Some("https://id.example".to_owned()),
            audience: Some("switchboard".to_owned()),
        })
        .unwrap();
        let exp = now() + 60;
        let good =
            json!({"sub": "a", "exp": exp, "iss": "https://id.example", "aud": "switchboard"});
        assert!(strict.verify(&token(Algorithm::HS256, good)).is_ok());
        for claims in [
            json!({"sub": "a", "exp": exp, "iss": "https://id.example", "aud": "other"}),
            json!({"sub": "a", "exp": exp, "iss": "https://evil.example", "aud": "switchboard"}),
            json!({"sub": "a", "exp": exp, "iss": "https://id.example"}),
            json!({"sub": "a", "exp": exp, "aud": "switchboard"}),
        ] {
            assert!(
                strict
                    .verify(&token(Algorithm::HS256, claims.clone()))
                    .is_err(),
                "{claims}"
            );
        }
    }

    #[test]
    fn an_unsigned_token_is_refused() {
        // {"alg":"none","typ":"JWT"} . {"sub":"alice","exp":4102444800} . (no signature)
        let none =
            "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6NDEwMjQ0NDgwMH0.";
        assert!(authenticator().verify(none).is_err());
    }

    #[test]
    fn a_verified_token_is_remembered_until_its_expiry_and_only_by_its_exact_text() {
        let verified = VerifiedTokens::default();
        let alice = Identity {
            owner: Owner("alice".to_owned()),
            admin: false,
        };
        verified.insert("token-a", &alice, 1_000, 900);
        assert_eq!(verified.get("token-a", 1_000), Some(alice.clone()));
        assert_eq!(verified.get("token-a", 1_001), None, "expired");
        assert_eq!(verified.get("token-A", 950), None, "another text");
        let long = "x".repeat(VerifiedTokens::MAX_TOKEN_LEN + 1);
        verified.insert(&long, &alice, 1_000, 900);
        assert_eq!(verified.get(&long, 950), None, "too long to hold");
    }

    #[test]
    fn the_remembered_tokens_are_bounded() {
        let verified = VerifiedTokens::default();
        let owner = Identity {
            owner: Owner("o".to_owned()),
            admin: false,
        };
        // Half expire at 100, half at 1,000; at 500 a full set drops the expired half.
        for i in 0..VerifiedTokens::MAX {
            let until = if i % 2 == 0 { 100 } else { 1_000 };
            verified.insert(&format!("t{i}"), &owner, until, 0);
        }
        verified.insert("new", &owner, 1_000, 500);
        let held = verified.tokens.lock().map(|t| t.len()).unwrap_or_default();
        assert_eq!(held, VerifiedTokens::MAX / 2 + 1);
        assert_eq!(verified.get("t1", 500), Some(owner.clone()));
        assert_eq!(verified.get("new", 500), Some(owner));
    }

    #[test]
    fn a_token_verified_once_is_verified_again_and_a_changed_one_is_not() {
        let auth = authenticator();
        let t = token(Algorithm::HS256, json!({"sub": "alice", "exp": now() + 60}));
        assert_eq!(auth.verify(&t), Ok(Owner("alice".to_owned())));
        assert_eq!(auth.verify(&t), Ok(Owner("alice".to_owned())));
        // The same claims with a forged signature: not the remembered text, so verified, refused.
        let (signed, _) = t.rsplit_once('.').unwrap();
        assert!(auth.verify(&format!("{signed}.AAAA")).is_err());
        // A clone (each route's state) shares what was verified.
        assert!(auth.clone().verified.get(&t, unix_now()).is_some());
    }

    #[test]
    fn a_short_hs256_secret_is_refused_at_start() {
        let config = AuthConfig {
            algorithm: JwtAlgorithm::Hs256,
            key: SecretString::from("short"),
            issuer: None,
            audience: None,
        };
        assert!(Authenticator::new(&config).is_err());
    }
}
