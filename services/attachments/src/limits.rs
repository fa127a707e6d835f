//! Per-request limits that were fixed and are settable now: the `download-url` rate and the
//! cap on multipart framing (see [`crate::quota`] and the `form` module for what they bound).

use platform::config::{ConfigError, Env};

/// The variable of [`Limits::downloads_per_minute`].
pub const DOWNLOAD_RATE_PER_MINUTE_VAR: &str = "SB_ATTACHMENTS_DOWNLOAD_RATE_PER_MINUTE";
/// The variable of [`Limits::downloads_burst`].
pub const DOWNLOAD_RATE_BURST_VAR: &str = "SB_ATTACHMENTS_DOWNLOAD_RATE_BURST";
/// The variable of [`Limits::max_part_header_bytes`].
pub const MAX_PART_HEADER_BYTES_VAR: &str = "SB_ATTACHMENTS_MAX_PART_HEADER_BYTES";

/// The least [`Limits::max_part_header_bytes`]: a browser's part headers (the boundary line,
/// `Content-Disposition` with a long file name, `Content-Type`) must fit.
pub const MIN_PART_HEADER_BYTES: usize = 1024;
/// The most [`Limits::max_part_header_bytes`]: the cap exists because multer holds and
/// rescans a header section until it ends; past this it no longer protects the service.
pub const MAX_PART_HEADER_BYTES: usize = 1024 * 1024;

/// The `download-url` rate and the multipart framing cap (`SB_ATTACHMENTS_DOWNLOAD_RATE_*`,
/// `SB_ATTACHMENTS_MAX_PART_HEADER_BYTES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `download-url` calls per owner per minute, per replica
    /// (`SB_ATTACHMENTS_DOWNLOAD_RATE_PER_MINUTE`, default 120, at least 1); one more is 429
    /// with `Retry-After`.
    pub downloads_per_minute: u32,
    /// Burst of the same (`SB_ATTACHMENTS_DOWNLOAD_RATE_BURST`, default 60, at least 1): a page
    /// opening many files at once.
    pub downloads_burst: u32,
    /// Most bytes of one multipart part's header section, and of the preamble before the first
    /// part, of a server upload (`SB_ATTACHMENTS_MAX_PART_HEADER_BYTES`, default 16384, from
    /// 1024 to 1048576); past it 413 `payload_too_large`.
    pub max_part_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            downloads_per_minute: crate::quota::DOWNLOADS_PER_MINUTE,
            downloads_burst: crate::quota::DOWNLOADS_BURST,
            max_part_header_bytes: crate::form::DEFAULT_PART_HEADER_BYTES,
        }
    }
}

impl Limits {
    /// Reads the limits from the environment; a value out of bounds fails naming its variable.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let defaults = Self::default();
        Ok(Self {
            downloads_per_minute: env
                .positive(DOWNLOAD_RATE_PER_MINUTE_VAR, defaults.downloads_per_minute)?,
            downloads_burst: env.positive(DOWNLOAD_RATE_BURST_VAR, defaults.downloads_burst)?,
            max_part_header_bytes: {
                let bytes: usize =
                    env.or(MAX_PART_HEADER_BYTES_VAR, defaults.max_part_header_bytes)?;
                if !(MIN_PART_HEADER_BYTES..=MAX_PART_HEADER_BYTES).contains(&bytes) {
                    return Err(ConfigError::Invalid {
                        name: MAX_PART_HEADER_BYTES_VAR.to_owned(),
                        reason: format!(
                            "must be from {MIN_PART_HEADER_BYTES} to {MAX_PART_HEADER_BYTES} bytes"
                        ),
                    });
                }
                bytes
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pairs: &[(&str, &str)]) -> Result<Limits, ConfigError> {
        Limits::from_env(&Env::from_pairs(pairs.iter().copied()))
    }

    /// The variable a refusal names.
    fn named(result: Result<Limits, ConfigError>) -> String {
        match result {
            Err(ConfigError::Invalid { name, .. } | ConfigError::Missing(name)) => name,
            Ok(limits) => format!("accepted: {limits:?}"),
        }
    }

    #[test]
    fn unset_the_limits_are_the_former_fixed_ones() {
        assert_eq!(
            limits(&[]).unwrap(),
            Limits {
                downloads_per_minute: 120,
                downloads_burst: 60,
                max_part_header_bytes: 16 * 1024,
            }
        );
    }

    #[test]
    fn each_limit_is_read_from_its_variable() {
        let read = limits(&[
            (DOWNLOAD_RATE_PER_MINUTE_VAR, "600"),
            (DOWNLOAD_RATE_BURST_VAR, "1"),
            (MAX_PART_HEADER_BYTES_VAR, "65536"),
        ])
        .unwrap();
        assert_eq!(
            read,
            Limits {
                downloads_per_minute: 600,
                downloads_burst: 1,
                max_part_header_bytes: 65536,
            }
        );
        // The bounds of the framing cap are allowed.
        for bytes in ["1024", "1048576"] {
            let read = limits(&[(MAX_PART_HEADER_BYTES_VAR, bytes)]).unwrap();
            assert_eq!(read.max_part_header_bytes.to_string(), bytes);
        }
    }

    #[test]
    fn a_bad_value_is_refused_naming_its_variable() {
        for (name, bad) in [
            (DOWNLOAD_RATE_PER_MINUTE_VAR, "0"),
            (DOWNLOAD_RATE_PER_MINUTE_VAR, "-1"),
            (DOWNLOAD_RATE_PER_MINUTE_VAR, "lots"),
            (DOWNLOAD_RATE_BURST_VAR, "0"),
            (DOWNLOAD_RATE_BURST_VAR, "4294967296"),
            (MAX_PART_HEADER_BYTES_VAR, "1023"),
            (MAX_PART_HEADER_BYTES_VAR, "1048577"),
            (MAX_PART_HEADER_BYTES_VAR, "0"),
            (MAX_PART_HEADER_BYTES_VAR, "16KiB"),
        ] {
            assert_eq!(named(limits(&[(name, bad)])), name, "{name}={bad}");
        }
    }

    #[test]
    fn an_out_of_range_framing_cap_says_the_range() {
        let Err(ConfigError::Invalid { reason, .. }) =
            limits(&[(MAX_PART_HEADER_BYTES_VAR, "512")])
        else {
            panic!("512 bytes accepted");
        };
        assert!(
            reason.contains("1024") && reason.contains("1048576"),
            "{reason}"
        );
    }
}
