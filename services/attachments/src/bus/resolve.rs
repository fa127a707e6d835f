//! The request/reply endpoints on NATS (queue group `attachments`, one replica answers): a thin
//! edge that decodes a request, calls the domain and encodes its answer. Resolve a URL or
//! `content_url` to a verified file the caller owns and sign download URLs in bulk
//! ([`crate::lookup`]), keep a file the agent generated, inline or through a presigned upload
//! when large ([`crate::generated`]), erase an owner's files ([`crate::erase`]) and link files
//! ([`crate::link`]).

use futures::StreamExt;
use protocol::files::{
    GeneratedUpload, GeneratedUploadOutcome, GeneratedUploadReply, RefusalReason,
    RegisterGenerated, RegisterOutcome, RegisterReply, ResolveOutcome, ResolveReply,
    ResolveRequest, SignReply, SignRequest,
};
use protocol::messaging::{ATTACHMENTS_QUEUE, Names};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::generated::Generated;
use crate::lookup::Lookup;

/// Requests answered at once by one replica.
const CONCURRENCY: usize = 64;

pub(crate) struct Resolver {
    /// For erasure and links.
    pub(crate) pool: PgPool,
    /// For erasure.
    pub(crate) s3: aws_sdk_s3::Client,
    /// Resolving and signing.
    pub(crate) lookup: Lookup,
    /// Generated files.
    pub(crate) generated: Generated,
}

impl Resolver {
    /// Answers the endpoints until `shutdown`.
    pub(crate) async fn serve(
        self,
        client: async_nats::Client,
        names: Names,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let resolve_subject = names.attachments_resolve_subject();
        let sign_subject = names.attachments_sign_subject();
        let upload_subject = names.attachments_generated_upload_subject();
        let erase_subject = names.attachments_erase_subject();
        let link_subject = names.attachments_link_subject();
        let mut subscriptions = Vec::new();
        for subject in [
            &resolve_subject,
            &sign_subject,
            &upload_subject,
            &erase_subject,
            &link_subject,
            &names.attachments_register_subject(),
        ] {
            subscriptions.push(
                client
                    .queue_subscribe(subject.clone(), ATTACHMENTS_QUEUE.to_owned())
                    .await?,
            );
        }
        futures::stream::select_all(subscriptions)
            .take_until(shutdown.cancelled_owned())
            .for_each_concurrent(CONCURRENCY, |message| {
                let client = client.clone();
                let (this, names, resolve_subject, sign_subject, upload_subject, erase_subject) = (
                    &self,
                    &names,
                    &resolve_subject,
                    &sign_subject,
                    &upload_subject,
                    &erase_subject,
                );
                let link_subject = &link_subject;
                // The handler's span, a child of the caller's (runs admitting a run, history
                // signing links or erasing files, a worker storing a file).
                let span = if message.subject.as_str() == resolve_subject.as_str() {
                    tracing::info_span!("attachments.resolve.handle", otel.kind = "server")
                } else if message.subject.as_str() == sign_subject.as_str() {
                    tracing::info_span!("attachments.sign.handle", otel.kind = "server")
                } else if message.subject.as_str() == upload_subject.as_str() {
                    tracing::info_span!("attachments.generated_upload.handle", otel.kind = "server")
                } else if message.subject.as_str() == erase_subject.as_str() {
                    tracing::info_span!("attachments.erase.handle", otel.kind = "server")
                } else if message.subject.as_str() == link_subject.as_str() {
                    tracing::info_span!("attachments.link.handle", otel.kind = "server")
                } else {
                    tracing::info_span!("attachments.register.handle", otel.kind = "server")
                };
                platform::rpc::adopt(&span, &message);
                async move {
                    let Some(reply) = message.reply.clone() else {
                        return;
                    };
                    let subject = message.subject.as_str();
                    // Only a caller's inbox is answered (`nats_auth::reply_from_caller`): a
                    // message JetStream delivered here from a stream is not a request.
                    if !platform::nats_auth::reply_from_caller(names, subject, &reply) {
                        metrics::counter!("switchboard_nats_requests_refused_total", "endpoint" => subject.to_owned())
                            .increment(1);
                        tracing::warn!(subject, reply = %reply, "request whose reply is no caller's inbox ignored");
                        return;
                    }
                    let answer = if subject == resolve_subject.as_str() {
                        this.answer_resolve(&message.payload).await
                    } else if subject == sign_subject.as_str() {
                        this.answer_sign(&message.payload).await
                    } else if subject == upload_subject.as_str() {
                        this.answer_generated_upload(&message.payload).await
                    } else if subject == erase_subject.as_str() {
                        crate::erase::answer(&this.pool, &this.s3, &message.payload).await
                    } else if subject == link_subject.as_str() {
                        crate::link::answer(&this.pool, &message.payload).await
                    } else {
                        this.answer_register(&message.payload).await
                    };
                    match answer {
                        Ok(payload) => {
                            if let Err(err) = client.publish(reply, payload.into()).await {
                                tracing::warn!(error = %err, "cannot answer a request");
                            }
                        }
                        // No answer: the caller times out and reports the dependency unavailable.
                        Err(err) => {
                            tracing::error!(subject, error = format!("{err:#}"), "request failed")
                        }
                    }
                }
                .instrument(span)
            })
            .await;
        Ok(())
    }

    async fn answer_resolve(&self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let outcome = match serde_json::from_slice::<ResolveRequest>(payload) {
            Ok(ResolveRequest::V1 {
                owner,
                url,
                session_id,
            }) => {
                self.lookup
                    .resolve(&owner, &url, session_id.as_deref())
                    .await?
            }
            Err(err) => {
                tracing::warn!(error = %err, "undecodable resolve request");
                ResolveOutcome::Refused {
                    reason: RefusalReason::BadUrl,
                }
            }
        };
        Ok(serde_json::to_vec(&ResolveReply::V1(outcome))?)
    }

    async fn answer_sign(&self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let SignRequest::V1 { owner, urls } = serde_json::from_slice(payload)?;
        let urls = self.lookup.sign(&owner, &urls).await?;
        Ok(serde_json::to_vec(&SignReply::V1 {
            urls,
            expires_in: self.lookup.download_ttl.as_secs(),
        })?)
    }

    async fn answer_register(&self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let outcome = match serde_json::from_slice::<RegisterGenerated>(payload) {
            Ok(request) => self.generated.register(request).await?,
            Err(err) => RegisterOutcome::Refused {
                message: format!("undecodable request: {err}"),
            },
        };
        Ok(serde_json::to_vec(&RegisterReply::V1(outcome))?)
    }

    async fn answer_generated_upload(&self, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
        let outcome = match serde_json::from_slice::<GeneratedUpload>(payload) {
            Ok(request) => self.generated.upload(request).await?,
            Err(err) => GeneratedUploadOutcome::Refused {
                message: format!("undecodable request: {err}"),
            },
        };
        Ok(serde_json::to_vec(&GeneratedUploadReply::V1(outcome))?)
    }
}
