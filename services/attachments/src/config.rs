//! Settings of the attachments service, read from the environment.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::HeaderValue;
use platform::auth::AuthConfig;
use platform::config::{ConfigError, Env};
use platform::nats::NatsConfig;
use platform::s3::S3Config;
use secrecy::SecretString;

use crate::{Limits, quota};

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
pub(crate) fn default_public_url(bound: SocketAddr) -> String {
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
        let settings = crate::Application::config(&env(&[
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
            crate::Application::config(&env(&[("SB_ATTACHMENTS_MAX_PART_HEADER_BYTES", "100")]));
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
