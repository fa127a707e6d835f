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

/// Stream limits of every test's NATS prefix: JetStream reserves a stream's `max_bytes` on
/// disk, so the production defaults (gigabytes) times hundreds of test prefixes would exhaust
/// the server's storage.
pub const TEST_STREAM_LIMITS: [(&str, &str); 3] = [
    ("SB_NATS_RUNS_MAX_BYTES", "67108864"),
    ("SB_NATS_EVENTS_MAX_BYTES", "67108864"),
    ("SB_NATS_KV_MAX_BYTES", "8388608"),
];

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

    /// NATS settings with a prefix no other test uses, and the small stream limits of
    /// [`TEST_STREAM_LIMITS`].
    pub fn fresh_nats(&self) -> NatsConfig {
        let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let mut pairs = vec![
            ("SB_NATS_URL", self.nats_url.as_str()),
            ("SB_NATS_PREFIX", prefix.as_str()),
        ];
        pairs.extend(TEST_STREAM_LIMITS);
        Env::from_pairs(pairs)
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
        self.token_with(sub, secs, serde_json::json!({}))
    }

    /// A bearer token for `sub` with the `scope` claim `scope`, valid for an hour.
    pub fn token_with_scope(&self, sub: &str, scope: &str) -> String {
        self.token_with(sub, 3600, serde_json::json!({"scope": scope}))
    }

    fn token_with(&self, sub: &str, secs: i64, extra: serde_json::Value) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let mut claims = serde_json::json!({"sub": sub, "iat": now, "exp": now + secs});
        if let (Some(claims), Some(extra)) = (claims.as_object_mut(), extra.as_object()) {
            claims.extend(extra.clone());
        }
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(self.auth().key.expose_secret().as_bytes()),
        )
        .unwrap_or_else(|err| unreachable!("HS256 encoding cannot fail: {err}"))
    }
}

/// The streams of one test prefix: its two streams and the streams of its KV buckets.
fn prefix_streams(names: &protocol::messaging::Names) -> Vec<String> {
    let mut streams = vec![names.runs_stream(), names.run_events_stream()];
    for bucket in [
        names.run_status_bucket(),
        names.thread_locks_bucket(),
        names.prompts_bucket(),
        names.prompt_deadlines_bucket(),
        names.agents_bucket(),
        names.thread_state_bucket(),
        names.owner_budgets_bucket(),
        names.owner_tokens_bucket(),
    ] {
        streams.push(format!("KV_{bucket}"));
    }
    streams
}

/// Deletes the streams and buckets a test made under its prefix (those that exist).
pub async fn remove_nats_prefix(
    nats_url: &str,
    names: &protocol::messaging::Names,
) -> anyhow::Result<()> {
    let client = async_nats::connect(nats_url).await?;
    let js = async_nats::jetstream::new(client);
    for stream in prefix_streams(names) {
        // A stream that was never made is fine; anything else is reported.
        if let Err(err) = js.delete_stream(&stream).await
            && !err.to_string().contains("stream not found")
        {
            anyhow::bail!("cannot delete stream {stream}: {err}");
        }
    }
    Ok(())
}

/// Runs [`remove_nats_prefix`] to the end from a `Drop` (which cannot await): on a thread of
/// its own, bounded to 10 s; failures are printed, never panicked on.
pub fn remove_nats_prefix_blocking(nats_url: String, names: protocol::messaging::Names) {
    let cleanup = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                remove_nats_prefix(&nats_url, &names),
            )
            .await
            .map_err(|_| anyhow::anyhow!("timed out"))?
        })
    });
    match cleanup.join() {
        Ok(Ok(())) => {}
        Ok(Err(err)) => eprintln!("test streams not removed: {err:#}"),
        Err(_) => eprintln!("test streams not removed: the cleanup thread panicked"),
    }
}

/// Deletes every stream left by earlier test runs (prefix `t` + 12 hex digits, so streams
/// `T<12 hex>_...` and buckets `KV_T<12 hex>_...`) made over an hour ago, so a test run going
/// on beside it keeps its streams; returns how many.
pub async fn remove_leftover_test_streams(nats_url: &str) -> anyhow::Result<usize> {
    use futures::TryStreamExt as _;
    let client = async_nats::connect(nats_url).await?;
    let js = async_nats::jetstream::new(client);
    let names: Vec<String> = js.stream_names().try_collect().await?;
    let is_test = |name: &str| {
        let name = name.strip_prefix("KV_").unwrap_or(name);
        name.len() > 14
            && name.starts_with('T')
            && name.as_bytes()[13] == b'_'
            && name[1..13].bytes().all(|b| b.is_ascii_hexdigit())
    };
    let cutoff = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let mut removed = 0;
    for name in names.into_iter().filter(|n| is_test(n)) {
        let mut stream = js.get_stream(&name).await?;
        let created = std::time::SystemTime::from(stream.info().await?.created);
        if created < cutoff {
            js.delete_stream(&name).await?;
            removed += 1;
        }
    }
    Ok(removed)
}
