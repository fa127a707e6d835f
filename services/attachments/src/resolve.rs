//! The resolve endpoint on NATS: a URL or `content_url` from a run -> a verified file the
//! caller owns, or why not.

use futures::StreamExt;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode};
use protocol::files::{
    FileRef, RefusalReason, ResolveOutcome, ResolveReply, ResolveRequest, ResolvedFile,
    parse_file_url,
};
use protocol::messaging::{ATTACHMENTS_QUEUE, Names};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::store;

/// Requests answered at once by one replica.
const CONCURRENCY: usize = 64;

pub(crate) struct Resolver {
    pub(crate) pool: PgPool,
    pub(crate) s3: aws_sdk_s3::Client,
    /// Secret Supabase-style signed-URL tokens are verified with, when configured.
    pub(crate) supabase_secret: Option<SecretString>,
}

#[derive(Deserialize)]
struct SupabaseClaims {
    url: String,
}

impl Resolver {
    /// Resolves `url` for `owner`.
    pub(crate) async fn resolve(&self, owner: &str, url: &str) -> anyhow::Result<ResolveOutcome> {
        let refused = |reason| Ok(ResolveOutcome::Refused { reason });
        let Ok(file) = parse_file_url(url) else {
            return refused(RefusalReason::BadUrl);
        };
        if !self.token_ok(&file) {
            return refused(RefusalReason::BadSignature);
        }
        let Some(mut row) = store::find_owned(&self.pool, owner, &file.bucket, &file.path).await?
        else {
            return refused(RefusalReason::NotFound);
        };
        if row.status == "pending" {
            // Uploaded moments ago, perhaps: verify now rather than wait for the sweeper.
            row.status = match crate::verify::verify(&self.s3, &self.pool, &row).await? {
                crate::verify::Verdict::Verified => "verified".to_owned(),
                crate::verify::Verdict::Quarantined(_) => "quarantined".to_owned(),
                crate::verify::Verdict::Waiting => "pending".to_owned(),
                crate::verify::Verdict::Expired => return refused(RefusalReason::NotFound),
            };
        }
        match row.status.as_str() {
            "verified" => Ok(ResolveOutcome::Resolved(ResolvedFile {
                bucket: file.bucket,
                path: file.path,
                mime_type: row.content_type,
                file_name: row.file_name,
                size_bytes: row.size_bytes,
            })),
            "quarantined" => refused(RefusalReason::Quarantined),
            _ => refused(RefusalReason::NotVerified),
        }
    }

    /// A Supabase token must be valid for exactly this object when a secret is configured.
    fn token_ok(&self, file: &FileRef) -> bool {
        let (Some(token), Some(secret)) = (&file.token, &self.supabase_secret) else {
            return true;
        };
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp"]);
        validation.validate_aud = false;
        decode::<SupabaseClaims>(
            token,
            &DecodingKey::from_secret(secret.expose_secret().as_bytes()),
            &validation,
        )
        .is_ok_and(|data| data.claims.url == format!("{}/{}", file.bucket, file.path))
    }

    /// Answers resolve requests until `shutdown`.
    pub(crate) async fn serve(
        self,
        client: async_nats::Client,
        names: Names,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let requests = client
            .queue_subscribe(
                names.attachments_resolve_subject(),
                ATTACHMENTS_QUEUE.to_owned(),
            )
            .await?;
        requests
            .take_until(shutdown.cancelled_owned())
            .for_each_concurrent(CONCURRENCY, |message| {
                let client = client.clone();
                let this = &self;
                async move {
                    let Some(reply) = message.reply else { return };
                    let outcome = match serde_json::from_slice::<ResolveRequest>(&message.payload) {
                        Ok(ResolveRequest::V1 { owner, url }) => {
                            match this.resolve(&owner, &url).await {
                                Ok(outcome) => outcome,
                                Err(err) => {
                                    tracing::error!(error = format!("{err:#}"), "resolve failed");
                                    return; // no answer: the caller times out and answers 503
                                }
                            }
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "undecodable resolve request");
                            ResolveOutcome::Refused {
                                reason: RefusalReason::BadUrl,
                            }
                        }
                    };
                    match serde_json::to_vec(&ResolveReply::V1(outcome)) {
                        Ok(payload) => {
                            if let Err(err) = client.publish(reply, payload.into()).await {
                                tracing::warn!(error = %err, "cannot answer a resolve request");
                            }
                        }
                        Err(err) => tracing::error!(error = %err, "cannot encode a resolve reply"),
                    }
                }
            })
            .await;
        Ok(())
    }
}
