//! The attachments service: owns the file records (its own schema) and the S3 bucket.
//!
//! Presigned uploads with verified, per-owner SHA-256 dedup, signed downloads, delete, the
//! NATS resolve endpoint the runs service admits attachments with, and erasure of an owner's
//! files (of a thread, or all) for history.

mod download;
mod erase;
mod file_name;
mod form;
mod generated;
mod intake;
pub mod limits;
mod link;
mod lookup;
mod openapi;
pub mod policy;
pub mod quota;
mod resolve;
mod routes;
mod server_upload;
mod store;
mod upload_url;
mod verify;

pub use limits::Limits;
pub use upload_url::UploadUrlWork;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::FromRef;
use axum::http::{HeaderValue, Method, header};
use platform::auth::{AuthConfig, Authenticator};
use platform::config::{ConfigError, Env};
use platform::nats::NatsConfig;
use platform::s3::S3Config;
use secrecy::SecretString;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};

/// The schema attachments owns.
pub const SCHEMA: &str = "attachments";
/// Connections of the service's PostgreSQL pool.
const POOL_CONNECTIONS: u32 = 16;
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/attachments");

/// Settings of the attachments service.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listen address (`SB_ATTACHMENTS_ADDR`, default `127.0.0.1:8081`).
    pub addr: SocketAddr,
    /// Bearer-token verification.
    pub auth: AuthConfig,
    /// PostgreSQL URL (`SB_ATTACHMENTS_DATABASE_URL`).
    pub database_url: SecretString,
    /// Applies missing migrations at start (`SB_DB_MIGRATE`, default true); when false, only
    /// checks the schema has them (the `migrate` subcommand, run as a Job, applied them).
    pub migrate_on_start: bool,
    /// Object storage.
    pub s3: S3Config,
    /// NATS connection and names (request/reply endpoints).
    pub nats: NatsConfig,
    /// Secret of Supabase-style signed URLs; their tokens are verified when set
    /// (`SB_ATTACHMENTS_SUPABASE_JWT_SECRET`).
    pub supabase_jwt_secret: Option<SecretString>,
    /// Base URL browsers reach S3 at (`SB_S3_PUBLIC_ENDPOINT`, default `SB_S3_ENDPOINT`).
    pub public_endpoint: Option<String>,
    /// Base URL browsers reach this service at, which download links point to
    /// (`SB_ATTACHMENTS_PUBLIC_URL`, default `http://<bound listen address>`).
    pub public_url: Option<String>,
    /// How long an upload form is valid (`SB_ATTACHMENTS_UPLOAD_TTL_SECS`, default 300).
    pub upload_ttl: Duration,
    /// How long a download URL is valid (`SB_ATTACHMENTS_DOWNLOAD_TTL_SECS`, default 300).
    pub download_ttl: Duration,
    /// How often pending uploads are verified (`SB_ATTACHMENTS_SWEEP_SECS`, default 2).
    pub sweep_every: Duration,
    /// Browser origins allowed to call the HTTP API cross-origin (`SB_CORS_ALLOWED_ORIGINS`,
    /// comma-separated exact origins such as `https://chat.example.com`; default none: no CORS).
    pub cors_allowed_origins: Vec<String>,
    /// Per-owner upload rate, unfinished uploads and storage quotas.
    pub quota: quota::QuotaConfig,
    /// The `download-url` rate and the multipart framing cap
    /// (`SB_ATTACHMENTS_DOWNLOAD_RATE_*`, `SB_ATTACHMENTS_MAX_PART_HEADER_BYTES`).
    pub limits: Limits,
}

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            addr: env.or(
                "SB_ATTACHMENTS_ADDR",
                SocketAddr::from(([127, 0, 0, 1], 8081)),
            )?,
            auth: env.auth()?,
            database_url: env.secret("SB_ATTACHMENTS_DATABASE_URL")?,
            migrate_on_start: env.or("SB_DB_MIGRATE", true)?,
            s3: S3Config::from_env(env)?,
            nats: env.nats()?,
            supabase_jwt_secret: env
                .raw("SB_ATTACHMENTS_SUPABASE_JWT_SECRET")
                .map(|s| SecretString::from(s.to_owned())),
            public_endpoint: env.optional("SB_S3_PUBLIC_ENDPOINT")?,
            public_url: env
                .raw(PUBLIC_URL_VAR)
                .map(parse_public_url)
                .transpose()
                .map_err(|reason| ConfigError::Invalid {
                    name: PUBLIC_URL_VAR.to_owned(),
                    reason,
                })?,
            upload_ttl: Duration::from_secs(env.or("SB_ATTACHMENTS_UPLOAD_TTL_SECS", 300)?),
            download_ttl: Duration::from_secs(env.or("SB_ATTACHMENTS_DOWNLOAD_TTL_SECS", 300)?),
            sweep_every: Duration::from_secs(env.or("SB_ATTACHMENTS_SWEEP_SECS", 2)?.max(1)),
            quota: {
                let d = quota::QuotaConfig::default();
                quota::QuotaConfig {
                    uploads_per_minute: env.or(
                        "SB_ATTACHMENTS_UPLOAD_RATE_PER_MINUTE",
                        d.uploads_per_minute,
                    )?,
                    uploads_burst: env.or("SB_ATTACHMENTS_UPLOAD_RATE_BURST", d.uploads_burst)?,
                    max_pending: env.or("SB_ATTACHMENTS_MAX_PENDING_PER_OWNER", d.max_pending)?,
                    max_files: env.or("SB_ATTACHMENTS_MAX_FILES_PER_OWNER", d.max_files)?,
                    max_bytes: env.or("SB_ATTACHMENTS_MAX_BYTES_PER_OWNER", d.max_bytes)?,
                }
            },
            cors_allowed_origins: env
                .raw(CORS_ORIGINS_VAR)
                .map(parse_origins)
                .transpose()
                .map_err(|reason| ConfigError::Invalid {
                    name: CORS_ORIGINS_VAR.to_owned(),
                    reason,
                })?
                .unwrap_or_default(),
            limits: Limits::from_env(env)?,
        })
    }
}

const CORS_ORIGINS_VAR: &str = "SB_CORS_ALLOWED_ORIGINS";
const PUBLIC_URL_VAR: &str = "SB_ATTACHMENTS_PUBLIC_URL";

/// An http(s) base URL without query or fragment, its trailing slashes dropped.
fn parse_public_url(raw: &str) -> Result<String, String> {
    let url = raw.trim().trim_end_matches('/');
    let host = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{raw:?} is not an http(s) URL"))?;
    if host.is_empty() || host.starts_with('/') || url.contains(['?', '#', ' ']) {
        return Err(format!(
            "{raw:?} is not a base URL (scheme://host[:port][/path], no query)"
        ));
    }
    Ok(url.to_owned())
}

/// Where download links point when no public URL is configured: the bound address, a wildcard
/// one (`0.0.0.0`, `::`) read as loopback.
fn default_public_url(bound: SocketAddr) -> String {
    let mut addr = bound;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{addr}")
}

/// Splits a comma-separated list of origins, each exactly as a browser sends it in `Origin`:
/// `scheme://host[:port]`, no path, no trailing slash (which would never match), no wildcard.
fn parse_origins(raw: &str) -> Result<Vec<String>, String> {
    raw.split(',')
        .map(str::trim)
        .filter(|origin| !origin.is_empty())
        .map(|origin| {
            let host = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .ok_or_else(|| format!("{origin:?} is not an http(s) origin"))?;
            let valid = !host.is_empty()
                && !host.contains(['/', '?', '#', '*', '@'])
                && origin.parse::<HeaderValue>().is_ok();
            if valid {
                Ok(origin.to_owned())
            } else {
                Err(format!(
                    "{origin:?} is not an origin (scheme://host[:port], nothing after)"
                ))
            }
        })
        .collect()
}

/// The CORS policy for browser clients on `origins`, or none when the list is empty.
fn cors_layer(origins: &[String]) -> anyhow::Result<Option<CorsLayer>> {
    if origins.is_empty() {
        return Ok(None);
    }
    let origins = origins
        .iter()
        .map(|origin| {
            origin
                .parse::<HeaderValue>()
                .with_context(|| format!("invalid CORS origin {origin:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .max_age(Duration::from_secs(600)),
    ))
}

/// The service's PostgreSQL pool (16 connections, `POOL_CONNECTIONS`; the `attachments` schema
/// first on the search path), migrated if `migrate_on_start`; the benchmarks open theirs here too.
pub async fn connect_pool(config: &Config) -> anyhow::Result<PgPool> {
    platform::db::connect(
        &config.database_url,
        SCHEMA,
        &MIGRATOR,
        POOL_CONNECTIONS,
        config.migrate_on_start,
    )
    .await
}

/// Shared state of the handlers.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) pool: PgPool,
    pub(crate) s3: aws_sdk_s3::Client,
    /// Credentials and public endpoints of upload forms and download links.
    pub(crate) signer: Arc<policy::Signer>,
    pub(crate) bucket: String,
    pub(crate) upload_ttl: Duration,
    pub(crate) download_ttl: Duration,
    pub(crate) quota: Arc<quota::Quota>,
    /// The per-owner rates of upload forms and download links, across the fleet.
    pub(crate) rates: Arc<quota::Rates>,
    /// How long the framing of a server upload's form may be (`SB_ATTACHMENTS_MAX_PART_HEADER_BYTES`).
    pub(crate) part_header_limit: form::PartHeaderLimit,
    /// Verifies pending files, each once at a time (shared with the resolver and the sweeper).
    pub(crate) verifier: Arc<verify::Verifier>,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        Arc::clone(&state.auth)
    }
}

impl FromRef<AppState> for form::PartHeaderLimit {
    fn from_ref(state: &AppState) -> Self {
        state.part_header_limit
    }
}

/// What the background verifier needs.
struct Sweeper {
    verifier: Arc<verify::Verifier>,
    every: Duration,
}

/// Every `(method, path)` the service serves: the table its router is built from, with the
/// health routes. The system tests compare it with the service's `/openapi.json`.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    platform::openapi::served(&routes::endpoints())
}

/// The built service, bound and ready to run.
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    resolver: resolve::Resolver,
    sweeper: Sweeper,
    client: async_nats::Client,
    names: protocol::messaging::Names,
}

impl platform::service::Service for Application {
    type Config = Config;
    const NAME: &'static str = "attachments";

    fn config(env: &Env) -> Result<Config, ConfigError> {
        Config::from_env(env)
    }

    /// Applies the `attachments` schema's migrations.
    async fn migrate(env: &Env) -> anyhow::Result<()> {
        platform::db::migrate(
            &env.secret("SB_ATTACHMENTS_DATABASE_URL")?,
            SCHEMA,
            &MIGRATOR,
        )
        .await
    }

    /// Migrates the schema, makes sure the bucket exists, binds the listener.
    async fn build(config: Config) -> anyhow::Result<Self> {
        let limits = config.limits;
        let auth = Arc::new(Authenticator::new(&config.auth)?);
        let pool = connect_pool(&config).await?;
        let s3 = platform::s3::client(&config.s3);
        platform::s3::ensure_bucket(&s3, &config.s3.bucket).await?;
        let (client, js) = platform::nats::connect(&config.nats, "attachments").await?;
        let probes = vec![
            ("postgres", platform::db::probe(pool.clone())),
            (
                "s3",
                platform::s3::probe(s3.clone(), config.s3.bucket.clone()),
            ),
            ("nats", platform::nats::probe(js.clone())),
        ];
        // Bound first: download links default to the bound address (port 0 in tests).
        let listener = platform::service::bind(config.addr).await?;
        let download_base = match &config.public_url {
            Some(url) => url.clone(),
            None => default_public_url(
                listener
                    .local_addr()
                    .context("the listener has no local address")?,
            ),
        };
        let public_endpoint = config
            .public_endpoint
            .clone()
            .or_else(|| config.s3.endpoint.clone())
            .unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", config.s3.region));
        let signer = Arc::new(policy::Signer {
            access_key: config.s3.access_key.clone(),
            secret_key: config.s3.secret_key.clone(),
            region: config.s3.region.clone(),
            public_endpoint,
            download_base,
        });
        let quota = Arc::new(quota::Quota::new(config.quota.clone()));
        let budgets = platform::lifecycle::ensure_owner_budgets(&js, &config.nats).await?;
        let rates = Arc::new(quota::Rates::new(&config.quota, &limits, budgets));
        let verifier = verify::Verifier::new(s3.clone(), pool.clone());
        let resolver = resolve::Resolver {
            pool: pool.clone(),
            s3: s3.clone(),
            lookup: lookup::Lookup {
                pool: pool.clone(),
                supabase_secret: config.supabase_jwt_secret.clone(),
                signer: Arc::clone(&signer),
                download_ttl: config.download_ttl,
                verifier: Arc::clone(&verifier),
            },
            generated: generated::Generated {
                pool: pool.clone(),
                s3: s3.clone(),
                signer: Arc::clone(&signer),
                bucket: config.s3.bucket.clone(),
                upload_ttl: config.upload_ttl,
                quota: Arc::clone(&quota),
            },
        };
        let sweeper = Sweeper {
            verifier: Arc::clone(&verifier),
            every: config.sweep_every,
        };
        let state = AppState {
            auth,
            pool,
            s3,
            signer,
            bucket: config.s3.bucket.clone(),
            upload_ttl: config.upload_ttl,
            download_ttl: config.download_ttl,
            quota,
            rates,
            part_header_limit: form::PartHeaderLimit(limits.max_part_header_bytes),
            verifier,
        };
        let mut router = routes::router(state).merge(platform::http::health_routes(probes));
        if let Some(cors) = cors_layer(&config.cors_allowed_origins)? {
            router = router.layer(cors);
        }
        Ok(Self {
            listener,
            router,
            resolver,
            sweeper,
            client,
            names: config.nats.names,
        })
    }

    /// The bound port.
    fn port(&self) -> u16 {
        platform::service::port(&self.listener)
    }

    /// Serves until `shutdown` is cancelled.
    async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let http = platform::http::serve(self.listener, self.router, shutdown.clone());
        let resolver = self
            .resolver
            .serve(self.client, self.names, shutdown.clone());
        let sweeper = verify::sweep(self.sweeper.verifier, self.sweeper.every, shutdown);
        let (http, resolved, ()) = tokio::join!(http, resolver, sweeper);
        http.context("attachments HTTP server failed")?;
        resolved
    }
}

#[cfg(test)]
mod tests {
    use super::{default_public_url, parse_origins, parse_public_url};
    use platform::config::{ConfigError, Env};
    use platform::service::Service as _;

    /// The least environment the service reads, and `extra`.
    fn env(extra: &[(&'static str, &'static str)]) -> Env {
        let base = [
            ("SB_JWT_ALG", "HS256"),
            (
                "SB_JWT_SECRET",
                "a-secret-of-at-least-thirty-two-bytes-0123",
            ),
            ("SB_ATTACHMENTS_DATABASE_URL", "postgres://localhost/x"),
            ("SB_S3_BUCKET", "files"),
            ("SB_S3_ACCESS_KEY", "key"),
            ("SB_S3_SECRET_KEY", "secret"),
        ];
        Env::from_pairs(base.iter().chain(extra).copied())
    }

    #[test]
    fn the_service_reads_its_limits_with_its_config() {
        let settings = super::Application::config(&env(&[
            ("SB_ATTACHMENTS_DOWNLOAD_RATE_PER_MINUTE", "30"),
            ("SB_ATTACHMENTS_DOWNLOAD_RATE_BURST", "5"),
            ("SB_ATTACHMENTS_MAX_PART_HEADER_BYTES", "4096"),
        ]))
        .unwrap();
        assert_eq!(
            settings.limits,
            super::Limits {
                downloads_per_minute: 30,
                downloads_burst: 5,
                max_part_header_bytes: 4096,
            }
        );
        let refused =
            super::Application::config(&env(&[("SB_ATTACHMENTS_MAX_PART_HEADER_BYTES", "100")]));
        assert!(
            matches!(&refused, Err(ConfigError::Invalid { name, .. }) if name == "SB_ATTACHMENTS_MAX_PART_HEADER_BYTES"),
            "{refused:?}"
        );
    }

    #[test]
    fn cors_origins_are_exact_http_origins() {
        assert_eq!(
            parse_origins(" https://chat.example.com , http://127.0.0.1:5173,"),
            Ok(vec![
                "https://chat.example.com".to_owned(),
                "http://127.0.0.1:5173".to_owned()
            ])
        );
        for bad in [
            "chat.example.com",
            "https://chat.example.com/",
            "https://*.example.com",
            "ftp://example.com",
            "https://",
        ] {
            assert!(parse_origins(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_public_url_is_an_http_base_and_defaults_to_the_bound_address() {
        assert_eq!(
            parse_public_url("https://files.example.com/api/"),
            Ok("https://files.example.com/api".to_owned())
        );
        for bad in [
            "files.example.com",
            "https://",
            "https:///x",
            "https://a/?x=1",
        ] {
            assert!(parse_public_url(bad).is_err(), "{bad}");
        }
        let bound = |s: &str| s.parse().unwrap();
        assert_eq!(
            default_public_url(bound("127.0.0.1:41234")),
            "http://127.0.0.1:41234"
        );
        assert_eq!(
            default_public_url(bound("0.0.0.0:8081")),
            "http://127.0.0.1:8081"
        );
        assert_eq!(default_public_url(bound("[::]:8081")), "http://[::1]:8081");
    }
}
