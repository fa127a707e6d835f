//! Typed configuration from environment variables.
//!
//! Services describe their settings as structs and read them through [`Env`], which names the
//! variable in every error so a bad deployment fails at start with a message that says what to fix.

use std::collections::HashMap;
use std::str::FromStr;

use secrecy::SecretString;

use crate::auth::{AuthConfig, JwtAlgorithm};

/// A setting that is missing or cannot be parsed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is not set.
    #[error("environment variable {0} is required but not set")]
    Missing(String),
    /// A variable is set to something that cannot be used.
    #[error("environment variable {name} is invalid: {reason}")]
    Invalid {
        /// The variable.
        name: String,
        /// Why its value cannot be used.
        reason: String,
    },
}

/// JWT secrets published in this repository (the local scripts' and the dev overlay's):
/// production refuses them.
pub const DEVELOPMENT_JWT_SECRETS: &[&str] = &["switchboard-local-development-secret-0123456789"];

/// A snapshot of environment variables to read settings from.
#[derive(Clone, Default)]
pub struct Env {
    vars: HashMap<String, String>,
}

/// The names of the variables only: their values may be secrets.
impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.vars.keys().collect();
        names.sort();
        f.debug_struct("Env")
            .field("names", &names)
            .finish_non_exhaustive()
    }
}

impl Env {
    /// The process environment.
    pub fn from_process() -> Self {
        Self {
            vars: std::env::vars().collect(),
        }
    }

    /// An explicit set of variables (tests, tools).
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The raw value of `name`, if set and not empty.
    pub fn raw(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A required variable, parsed.
    pub fn required<T>(&self, name: &str) -> Result<T, ConfigError>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        let raw = self
            .raw(name)
            .ok_or_else(|| ConfigError::Missing(name.to_owned()))?;
        parse(name, raw)
    }

    /// An optional variable, parsed.
    pub fn optional<T>(&self, name: &str) -> Result<Option<T>, ConfigError>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        self.raw(name).map(|raw| parse(name, raw)).transpose()
    }

    /// A variable with a default, parsed.
    pub fn or<T>(&self, name: &str, default: T) -> Result<T, ConfigError>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        Ok(self.optional(name)?.unwrap_or(default))
    }

    /// A count of at least 1, `default` when unset; 0 is refused naming the variable.
    pub fn positive(&self, name: &str, default: u32) -> Result<u32, ConfigError> {
        let value: u32 = self.or(name, default)?;
        if value == 0 {
            return Err(ConfigError::Invalid {
                name: name.to_owned(),
                reason: "must be at least 1".to_owned(),
            });
        }
        Ok(value)
    }

    /// A required secret.
    pub fn secret(&self, name: &str) -> Result<SecretString, ConfigError> {
        self.raw(name)
            .map(|raw| SecretString::from(raw.to_owned()))
            .ok_or_else(|| ConfigError::Missing(name.to_owned()))
    }

    /// The authentication settings shared by every service (`SB_JWT_*`).
    pub fn auth(&self) -> Result<AuthConfig, ConfigError> {
        let algorithm: JwtAlgorithm = self.or("SB_JWT_ALG", JwtAlgorithm::Hs256)?;
        let key = match algorithm {
            JwtAlgorithm::Hs256 => self.secret("SB_JWT_SECRET")?,
            JwtAlgorithm::Rs256 => self.secret("SB_JWT_PUBLIC_KEY")?,
        };
        let config = AuthConfig {
            algorithm,
            key,
            issuer: self.optional("SB_JWT_ISSUER")?,
            audience: self.optional("SB_JWT_AUDIENCE")?,
        };
        // In production a token must name who issued it and for whom: a token of another
        // service of the same identity provider must not open this one; and nobody may sign
        // with a secret anyone can read in this repository.
        if self.production()? {
            use secrecy::ExposeSecret as _;
            if algorithm == JwtAlgorithm::Hs256
                && DEVELOPMENT_JWT_SECRETS.contains(&config.key.expose_secret())
            {
                return Err(ConfigError::Invalid {
                    name: "SB_JWT_SECRET".to_owned(),
                    reason: "is the repository's development secret; production needs its own"
                        .to_owned(),
                });
            }
            for (name, value) in [
                ("SB_JWT_ISSUER", &config.issuer),
                ("SB_JWT_AUDIENCE", &config.audience),
            ] {
                if value.is_none() {
                    return Err(ConfigError::Missing(name.to_owned()));
                }
            }
        }
        // Build once so a malformed key fails at start, naming the variable.
        crate::auth::Authenticator::new(&config).map_err(|err| ConfigError::Invalid {
            name: match algorithm {
                JwtAlgorithm::Hs256 => "SB_JWT_SECRET".to_owned(),
                JwtAlgorithm::Rs256 => "SB_JWT_PUBLIC_KEY".to_owned(),
            },
            reason: err.to_string(),
        })?;
        Ok(config)
    }

    /// Whether this is a production deployment (`SB_ENV=production`; default `development`).
    pub fn production(&self) -> Result<bool, ConfigError> {
        match self.raw("SB_ENV").unwrap_or("development") {
            "production" => Ok(true),
            "development" => Ok(false),
            other => Err(ConfigError::Invalid {
                name: "SB_ENV".to_owned(),
                reason: format!("{other:?} is not production or development"),
            }),
        }
    }

    /// The NATS settings shared by every service (`SB_NATS_URL`, `SB_NATS_PREFIX`).
    pub fn nats(&self) -> Result<crate::nats::NatsConfig, ConfigError> {
        let prefix: String = self.or("SB_NATS_PREFIX", "sb".to_owned())?;
        let names =
            protocol::messaging::Names::new(&prefix).map_err(|err| ConfigError::Invalid {
                name: "SB_NATS_PREFIX".to_owned(),
                reason: err.to_string(),
            })?;
        let defaults = crate::nats::StreamLimits::default();
        let secs = |name: &str, default: std::time::Duration| {
            self.or(name, default.as_secs())
                .map(std::time::Duration::from_secs)
        };
        let limits = crate::nats::StreamLimits {
            replicas: self.or("SB_NATS_REPLICAS", defaults.replicas)?,
            runs_max_age: secs("SB_NATS_RUNS_MAX_AGE_SECS", defaults.runs_max_age)?,
            runs_dedup_window: secs("SB_NATS_RUNS_DEDUP_WINDOW_SECS", defaults.runs_dedup_window)?,
            runs_max_bytes: self.or("SB_NATS_RUNS_MAX_BYTES", defaults.runs_max_bytes)?,
            events_max_age: secs("SB_NATS_EVENTS_MAX_AGE_SECS", defaults.events_max_age)?,
            events_max_bytes: self.or("SB_NATS_EVENTS_MAX_BYTES", defaults.events_max_bytes)?,
            kv_max_bytes: self.or("SB_NATS_KV_MAX_BYTES", defaults.kv_max_bytes)?,
            max_msg_size: self.or("SB_NATS_MAX_MSG_SIZE", defaults.max_msg_size)?,
        };
        if !(1..=5).contains(&limits.replicas) {
            return Err(ConfigError::Invalid {
                name: "SB_NATS_REPLICAS".to_owned(),
                reason: "JetStream replicas are 1 to 5".to_owned(),
            });
        }
        let url: String = self.or("SB_NATS_URL", "nats://127.0.0.1:4222".to_owned())?;
        let credentials = self.nats_credentials()?;
        // Production talks to NATS as its own user over TLS, unless an operator says the
        // network already provides both (`SB_NATS_ALLOW_INSECURE=true`, e.g. a service mesh).
        if self.production()? && !self.or("SB_NATS_ALLOW_INSECURE", false)? {
            let authenticated = credentials.user.is_some() || credentials.creds_file.is_some();
            if !authenticated {
                return Err(ConfigError::Invalid {
                    name: "SB_NATS_USER".to_owned(),
                    reason: "production needs NATS authentication (SB_NATS_USER and \
                             SB_NATS_PASSWORD, or SB_NATS_CREDS_FILE), or \
                             SB_NATS_ALLOW_INSECURE=true"
                        .to_owned(),
                });
            }
            let tls = credentials.tls_required
                || url
                    .split(',')
                    .all(|server| server.trim().starts_with("tls://"));
            if !tls {
                return Err(ConfigError::Invalid {
                    name: "SB_NATS_TLS_REQUIRED".to_owned(),
                    reason: "production needs TLS to NATS (SB_NATS_TLS_REQUIRED=true or tls:// \
                             URLs), or SB_NATS_ALLOW_INSECURE=true"
                        .to_owned(),
                });
            }
        }
        Ok(crate::nats::NatsConfig {
            url,
            names,
            limits,
            credentials,
        })
    }

    /// The service's NATS user and TLS settings (`SB_NATS_USER`, `SB_NATS_PASSWORD`,
    /// `SB_NATS_CREDS_FILE`, `SB_NATS_TLS_*`).
    fn nats_credentials(&self) -> Result<crate::nats_auth::NatsCredentials, ConfigError> {
        let user: Option<String> = self.optional("SB_NATS_USER")?;
        let password = self.raw("SB_NATS_PASSWORD").map(SecretString::from);
        if user.is_some() && password.is_none() {
            return Err(ConfigError::Invalid {
                name: "SB_NATS_PASSWORD".to_owned(),
                reason: "required with SB_NATS_USER".to_owned(),
            });
        }
        let cert: Option<std::path::PathBuf> = self.optional("SB_NATS_TLS_CERT_FILE")?;
        let key: Option<std::path::PathBuf> = self.optional("SB_NATS_TLS_KEY_FILE")?;
        let tls_client = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(ConfigError::Invalid {
                    name: "SB_NATS_TLS_CERT_FILE".to_owned(),
                    reason: "a client certificate needs SB_NATS_TLS_KEY_FILE too".to_owned(),
                });
            }
        };
        Ok(crate::nats_auth::NatsCredentials {
            user,
            password,
            creds_file: self.optional("SB_NATS_CREDS_FILE")?,
            tls_ca_file: self.optional("SB_NATS_TLS_CA_FILE")?,
            tls_client,
            tls_required: self.or("SB_NATS_TLS_REQUIRED", false)?,
        })
    }

    /// Telemetry settings (`SB_LOG_FORMAT`, `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn telemetry(
        &self,
        service: &'static str,
    ) -> Result<crate::telemetry::TelemetryConfig, ConfigError> {
        Ok(crate::telemetry::TelemetryConfig {
            service,
            log_format: self.or("SB_LOG_FORMAT", crate::telemetry::LogFormat::Json)?,
            otlp_endpoint: self.optional("OTEL_EXPORTER_OTLP_ENDPOINT")?,
        })
    }
}

fn parse<T>(name: &str, raw: &str) -> Result<T, ConfigError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    raw.parse().map_err(|err: T::Err| ConfigError::Invalid {
        name: name.to_owned(),
        reason: err.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_required_variable_is_named_in_the_error() {
        let env = Env::from_pairs([("OTHER", "1")]);
        let err = env.required::<u16>("SB_PORT").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("environment variable SB_PORT is required but not set")
        );
    }

    #[test]
    fn an_unparsable_variable_is_named_in_the_error() {
        let env = Env::from_pairs([("SB_PORT", "eighty")]);
        let err = env.or::<u16>("SB_PORT", 80).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.starts_with("environment variable SB_PORT is invalid")));
    }

    #[test]
    fn hs256_without_a_secret_fails_naming_the_secret() {
        let env = Env::from_pairs([("SB_JWT_ALG", "HS256")]);
        let err = env.auth().err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("environment variable SB_JWT_SECRET is required but not set")
        );
    }

    #[test]
    fn an_unknown_algorithm_is_refused() {
        let env = Env::from_pairs([("SB_JWT_ALG", "none"), ("SB_JWT_SECRET", "x")]);
        assert!(env.auth().is_err());
    }

    #[test]
    fn production_refuses_to_start_without_issuer_and_audience() {
        let secret = ("SB_JWT_SECRET", "0123456789abcdef0123456789abcdef");
        let env = Env::from_pairs([("SB_ENV", "production"), secret]);
        assert_eq!(
            env.auth().err().map(|e| e.to_string()).as_deref(),
            Some("environment variable SB_JWT_ISSUER is required but not set")
        );
        let env = Env::from_pairs([
            ("SB_ENV", "production"),
            secret,
            ("SB_JWT_ISSUER", "https://id.example"),
        ]);
        assert_eq!(
            env.auth().err().map(|e| e.to_string()).as_deref(),
            Some("environment variable SB_JWT_AUDIENCE is required but not set")
        );
        let env = Env::from_pairs([
            ("SB_ENV", "production"),
            secret,
            ("SB_JWT_ISSUER", "https://id.example"),
            ("SB_JWT_AUDIENCE", "switchboard"),
        ]);
        assert!(env.auth().is_ok());
        assert!(
            Env::from_pairs([("SB_ENV", "prod"), secret])
                .auth()
                .is_err()
        );
        assert!(
            Env::from_pairs([secret]).auth().is_ok(),
            "development by default"
        );
    }

    #[test]
    fn production_refuses_the_repositorys_development_secret() {
        let base = [
            ("SB_ENV", "production"),
            ("SB_JWT_ISSUER", "https://auth.example.com/"),
            ("SB_JWT_AUDIENCE", "switchboard"),
        ];
        let with = |secret: &'static str| {
            Env::from_pairs(base.into_iter().chain([("SB_JWT_SECRET", secret)]))
        };
        let err = with(DEVELOPMENT_JWT_SECRETS[0])
            .auth()
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("SB_JWT_SECRET") && e.contains("development")),
            "{err:?}"
        );
        assert!(
            with("an-operators-own-secret-0123456789abcdef")
                .auth()
                .is_ok()
        );
        let development = Env::from_pairs([("SB_JWT_SECRET", DEVELOPMENT_JWT_SECRETS[0])]);
        assert!(development.auth().is_ok(), "development keeps working");
    }

    #[test]
    fn production_needs_an_authenticated_tls_connection_to_nats_unless_allowed() {
        let production = |extra: &[(&'static str, &'static str)]| {
            Env::from_pairs(
                [("SB_ENV", "production")]
                    .into_iter()
                    .chain(extra.iter().copied()),
            )
            .nats()
            .err()
            .map(|e| e.to_string())
        };
        let anonymous = production(&[]);
        assert!(
            anonymous
                .as_deref()
                .is_some_and(|e| e.contains("SB_NATS_USER")),
            "{anonymous:?}"
        );
        let user = [("SB_NATS_USER", "runs"), ("SB_NATS_PASSWORD", "pw")];
        let plaintext = production(&user);
        assert!(
            plaintext
                .as_deref()
                .is_some_and(|e| e.contains("SB_NATS_TLS_REQUIRED")),
            "{plaintext:?}"
        );
        let tls = [user[0], user[1], ("SB_NATS_TLS_REQUIRED", "true")];
        assert_eq!(production(&tls), None);
        let tls_urls = [
            user[0],
            user[1],
            ("SB_NATS_URL", "tls://a:4222,tls://b:4222"),
        ];
        assert_eq!(production(&tls_urls), None);
        assert_eq!(production(&[("SB_NATS_ALLOW_INSECURE", "true")]), None);
        assert!(
            Env::from_pairs([("X", "1")]).nats().is_ok(),
            "development is unchanged"
        );
    }

    #[test]
    fn debug_output_names_variables_without_their_values() {
        let env = Env::from_pairs([
            ("SB_JWT_SECRET", "hunter2-hunter2"),
            ("SB_ENV", "development"),
        ]);
        let shown = format!("{env:?}");
        assert!(
            shown.contains("SB_JWT_SECRET") && shown.contains("SB_ENV"),
            "{shown}"
        );
        assert!(
            !shown.contains("hunter2") && !shown.contains("development"),
            "{shown}"
        );
    }
}
