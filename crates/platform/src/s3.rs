//! The S3 client, configured for any S3-compatible endpoint.

use anyhow::Context as _;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use secrecy::{ExposeSecret, SecretString};

use crate::config::{ConfigError, Env};
use crate::http::Probe;

/// S3 settings (`SB_S3_*`).
#[derive(Debug, Clone)]
pub struct S3Config {
    /// Endpoint URL; `None` means AWS itself.
    pub endpoint: Option<String>,
    /// Region used for signing.
    pub region: String,
    /// Access key id.
    pub access_key: String,
    /// Secret access key.
    pub secret_key: SecretString,
    /// Bucket holding every file.
    pub bucket: String,
}

impl S3Config {
    /// Reads `SB_S3_ENDPOINT`, `SB_S3_REGION`, `SB_S3_ACCESS_KEY`, `SB_S3_SECRET_KEY`, `SB_S3_BUCKET`.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        Ok(Self {
            endpoint: env.optional("SB_S3_ENDPOINT")?,
            region: env.or("SB_S3_REGION", "us-east-1".to_owned())?,
            access_key: env.required("SB_S3_ACCESS_KEY")?,
            secret_key: env.secret("SB_S3_SECRET_KEY")?,
            bucket: env.or("SB_S3_BUCKET", "switchboard".to_owned())?,
        })
    }
}

/// A client for `config`; path-style addressing when a custom endpoint is set.
pub fn client(config: &S3Config) -> aws_sdk_s3::Client {
    let credentials = Credentials::new(
        &config.access_key,
        config.secret_key.expose_secret(),
        None,
        None,
        "switchboard-config",
    );
    let mut builder = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(config.region.clone()))
        .credentials_provider(credentials);
    if let Some(endpoint) = &config.endpoint {
        builder = builder.endpoint_url(endpoint).force_path_style(true);
    }
    aws_sdk_s3::Client::from_conf(builder.build())
}

/// Creates `bucket` unless it exists.
pub async fn ensure_bucket(client: &aws_sdk_s3::Client, bucket: &str) -> anyhow::Result<()> {
    if client.head_bucket().bucket(bucket).send().await.is_ok() {
        return Ok(());
    }
    match client.create_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(()),
        Err(err) => {
            // Another replica may have created it meanwhile.
            if client.head_bucket().bucket(bucket).send().await.is_ok() {
                Ok(())
            } else {
                Err(err).with_context(|| format!("cannot create bucket {bucket}"))
            }
        }
    }
}

/// Readiness probe: the bucket is reachable with our credentials.
pub fn probe(client: aws_sdk_s3::Client, bucket: String) -> Probe {
    std::sync::Arc::new(move || {
        let client = client.clone();
        let bucket = bucket.clone();
        Box::pin(async move {
            client
                .head_bucket()
                .bucket(bucket)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| format!("{}", aws_sdk_s3::error::DisplayErrorContext(e)))
        })
    })
}
