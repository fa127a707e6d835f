//! Test support: every integration test gets its own database, NATS prefix and S3 bucket on the
//! real infrastructure started by `scripts/infra.sh`, and tokens signed with the test secret.
//!
//! Nothing here skips a test when the infrastructure is down: a missing dependency fails loudly.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use jsonwebtoken::{EncodingKey, Header, encode};
use platform::auth::{AuthConfig, JwtAlgorithm};
use platform::config::Env;
use platform::nats::NatsConfig;
use platform::s3::S3Config;
use secrecy::{ExposeSecret, SecretString};
use sqlx::Connection;

/// Where the test infrastructure listens, read from the same variables the scripts export.
#[derive(Debug, Clone)]
pub struct Infra {
    /// Admin URL of the database server (its `switchboard` database).
    pub database_url: String,
    /// NATS server URL.
    pub nats_url: String,
    /// S3 settings (bucket replaced per test).
    pub s3: S3Config,
    /// HS256 secret tokens are signed with.
    pub jwt_secret: String,
}

impl Infra {
    /// Reads `SB_TEST_*` variables, defaulting to the ports of `scripts/infra.sh`.
    pub fn from_env() -> Self {
        let var =
            |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
        Self {
            database_url: var(
                "SB_TEST_DATABASE_URL",
                "postgres://switchboard:switchboard-local@127.0.0.1:55432/switchboard",
            ),
            nats_url: var("SB_TEST_NATS_URL", "nats://127.0.0.1:54222"),
            s3: S3Config {
                endpoint: Some(var("SB_TEST_S3_ENDPOINT", "http://127.0.0.1:59000")),
                region: "us-east-1".to_owned(),
                access_key: var("SB_TEST_S3_ACCESS_KEY", "switchboard-local"),
                secret_key: SecretString::from(var(
                    "SB_TEST_S3_SECRET_KEY",
                    "switchboard-local-secret-key",
                )),
                bucket: "switchboard".to_owned(),
            },
            jwt_secret: var(
                "SB_TEST_JWT_SECRET",
                "switchboard-local-development-secret-0123456789",
            ),
        }
    }

    /// Creates an empty database for one test and returns its URL.
    pub async fn fresh_database(&self) -> anyhow::Result<SecretString> {
        let name = format!("sbt_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(&self.database_url)
            .await
            .context("cannot reach the test PostgreSQL; run scripts/infra.sh")?;
        // `name` is generated above from hex digits only.
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .context("cannot create a test database")?;
        let base = self
            .database_url
            .rsplit_once('/')
            .map(|(base, _)| base)
            .context("database URL has no database name")?;
        Ok(SecretString::from(format!("{base}/{name}")))
    }

    /// NATS settings with a prefix no other test uses.
    pub fn fresh_nats(&self) -> NatsConfig {
        let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        Env::from_pairs([
            ("SB_NATS_URL", self.nats_url.as_str()),
            ("SB_NATS_PREFIX", prefix.as_str()),
        ])
        .nats()
        .unwrap_or_else(|err| unreachable!("generated prefix is valid: {err}"))
    }

    /// S3 settings with a bucket no other test uses.
    pub fn fresh_s3(&self) -> S3Config {
        S3Config {
            bucket: format!("sbt-{}", &uuid::Uuid::new_v4().simple().to_string()[..16]),
            ..self.s3.clone()
        }
    }

    /// Authentication settings matching [`Infra::token`].
    pub fn auth(&self) -> AuthConfig {
        AuthConfig {
            algorithm: JwtAlgorithm::Hs256,
            key: SecretString::from(self.jwt_secret.clone()),
            issuer: None,
            audience: None,
        }
    }

    /// A bearer token for `sub`, valid for an hour.
    pub fn token(&self, sub: &str) -> String {
        self.token_expiring(sub, 3600)
    }

    /// A bearer token for `sub` expiring `secs` from now (negative: already expired).
    pub fn token_expiring(&self, sub: &str, secs: i64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let claims = serde_json::json!({"sub": sub, "iat": now, "exp": now + secs});
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(self.auth().key.expose_secret().as_bytes()),
        )
        .unwrap_or_else(|err| unreachable!("HS256 encoding cannot fail: {err}"))
    }
}
