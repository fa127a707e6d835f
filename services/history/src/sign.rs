//! Fresh download URLs for the attachments history shows, asked of the attachments service in
//! one request per snapshot. History never signs or stores URLs itself: a URL is minted on
//! every read, so it is short-lived and follows deletes.

use std::time::Duration;

use protocol::files::{MAX_SIGN_BATCH, SignReply, SignRequest};
use protocol::messaging::Names;

/// How long a snapshot waits for the attachments service.
const SIGN_TIMEOUT: Duration = Duration::from_secs(2);

/// Asks the attachments service to sign URLs.
pub(crate) struct UrlSigner {
    client: async_nats::Client,
    subject: String,
}

impl UrlSigner {
    pub(crate) fn new(client: async_nats::Client, names: &Names) -> Self {
        Self {
            client,
            subject: names.attachments_sign_subject(),
        }
    }

    /// Signed URLs for `content_urls` of `owner`, in order; `None` where the file is gone or
    /// not the owner's. If the attachments service does not answer, every URL is `None` and the
    /// snapshot is still served (logged).
    #[tracing::instrument(name = "history.sign.urls", skip_all, fields(count = content_urls.len()))]
    pub(crate) async fn sign(&self, owner: &str, content_urls: Vec<String>) -> Vec<Option<String>> {
        let count = content_urls.len();
        if count == 0 {
            return Vec::new();
        }
        let mut signed = Vec::with_capacity(count);
        for batch in content_urls.chunks(MAX_SIGN_BATCH) {
            match self.sign_batch(owner, batch.to_vec()).await {
                Ok(urls) if urls.len() == batch.len() => signed.extend(urls),
                Ok(_) | Err(_) => {
                    tracing::warn!(
                        count = batch.len(),
                        "attachment URLs not signed; served as null"
                    );
                    signed.extend(std::iter::repeat_n(None, batch.len()));
                }
            }
        }
        signed
    }

    async fn sign_batch(
        &self,
        owner: &str,
        urls: Vec<String>,
    ) -> anyhow::Result<Vec<Option<String>>> {
        let request = SignRequest::V1 {
            owner: owner.to_owned(),
            urls,
        };
        let payload = serde_json::to_vec(&request)?;
        let reply = platform::rpc::request(
            &self.client,
            self.subject.clone(),
            payload.into(),
            SIGN_TIMEOUT,
        )
        .await?;
        let SignReply::V1 { urls, .. } = serde_json::from_slice(&reply.payload)?;
        Ok(urls)
    }
}
