//! Download links, served by this service rather than by S3, so every download carries the
//! headers that keep a browser from running what it fetched: `X-Content-Type-Options: nosniff`,
//! the verified `Content-Type`, `Content-Disposition: inline` only for the types on [`INLINE`]
//! (everything else, PDF, SVG and Office files included, is an `attachment`), and
//! `Content-Security-Policy: sandbox` for anything that is not a raster image. Links may be
//! served from the application's own origin (which holds the web client's token), so nothing
//! that can run is rendered there unsandboxed: a PDF is sandboxed too, and since Chromium's PDF
//! viewer refuses to run in a sandboxed document, it is downloaded rather than shown.
//!
//! A link is a capability, like an S3 presigned URL: `<base>/v2/files/content/{fileId}?expires=
//! <unix secs>&signature=<hex>`, where `signature` is HMAC-SHA256 over `"{fileId}:{expires}"`
//! with a key derived from the S3 secret (HMAC-SHA256(secret, [`KEY_LABEL`])). No bearer token
//! is needed, so `<a href>` and `<img src>` work; links are minted fresh on every read
//! (`download-url`, server uploads, history's bulk re-signing) and live for the download TTL.
//! The signature is checked in constant time before anything is looked up.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use hmac::{Hmac, Mac};
use protocol::file_types;
use secrecy::ExposeSecret as _;
use sha2::Sha256;
use uuid::Uuid;

use crate::policy::Signer;
use crate::store::FileRow;

type HmacSha256 = Hmac<Sha256>;

/// What the link key is derived from the S3 secret with; a new label retires every link.
const KEY_LABEL: &[u8] = b"switchboard download links v1";

/// The path download links are served under (`{base}{CONTENT_PATH}/{fileId}`).
pub(crate) const CONTENT_PATH: &str = "/v2/files/content";

/// The types a browser renders without running anything: served `inline`. Everything else
/// (PDF, whose viewer runs its scripts; SVG; Office documents; any type added later) is served
/// as an `attachment`.
const INLINE: &[&str] = &[
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "image/bmp",
    "text/plain",
    "text/csv",
];

/// Raster images: the only types served without `Content-Security-Policy: sandbox`.
const RASTER_IMAGES: &[&str] = &[
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "image/bmp",
];

/// The canonical allowed type of `content_type`, if it is one.
fn known(content_type: &str) -> Option<&'static str> {
    file_types::allowed(content_type).map(|t| t.mime)
}

/// `Content-Disposition` for a file: `inline` only for the types on [`INLINE`], else
/// `attachment`, with the name in RFC 6266 / RFC 5987 form.
pub(crate) fn disposition(content_type: &str, file_name: &str) -> String {
    let inline = known(content_type).is_some_and(|mime| INLINE.contains(&mime));
    let ascii: String = file_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ' ') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let encoded =
        percent_encoding::utf8_percent_encode(file_name, percent_encoding::NON_ALPHANUMERIC);
    let kind = if inline { "inline" } else { "attachment" };
    format!("{kind}; filename=\"{ascii}\"; filename*=UTF-8''{encoded}")
}

/// The link key: HMAC-SHA256(S3 secret, [`KEY_LABEL`]), ready to sign with (cloned per link).
fn link_key(signer: &Signer) -> anyhow::Result<HmacSha256> {
    let mut derive = HmacSha256::new_from_slice(signer.secret_key.expose_secret().as_bytes())
        .context("cannot key HMAC-SHA256")?;
    derive.update(KEY_LABEL);
    let key = derive.finalize().into_bytes();
    HmacSha256::new_from_slice(&key).context("cannot key HMAC-SHA256")
}

/// The MAC of one link: over `"{file_id}:{expires}"`, exactly as they appear in the link.
fn link_mac(key: &HmacSha256, file_id: &str, expires: &str) -> HmacSha256 {
    let mut mac = key.clone();
    mac.update(file_id.as_bytes());
    mac.update(b":");
    mac.update(expires.as_bytes());
    mac
}

fn unix_secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// Download links for `files`, in order, `None` staying `None`: on the signer's
/// `download_base`, valid for `ttl` from `now` (to the second).
pub(crate) fn presign<'a>(
    signer: &Signer,
    files: impl IntoIterator<Item = Option<&'a FileRow>>,
    ttl: Duration,
    now: SystemTime,
) -> anyhow::Result<Vec<Option<String>>> {
    let key = link_key(signer)?;
    let base = signer.download_base.trim_end_matches('/');
    let expires = (unix_secs(now) + ttl.as_secs()).to_string();
    Ok(files
        .into_iter()
        .map(|file| {
            file.map(|file| {
                let id = file.id.to_string();
                let signature = hex::encode(link_mac(&key, &id, &expires).finalize().into_bytes());
                format!("{base}{CONTENT_PATH}/{id}?expires={expires}&signature={signature}")
            })
        })
        .collect())
}

/// A download link for `file`, valid for `ttl` from now.
pub(crate) fn sign(signer: &Signer, file: &FileRow, ttl: Duration) -> anyhow::Result<String> {
    presign(signer, [Some(file)], ttl, SystemTime::now())?
        .into_iter()
        .flatten()
        .next()
        .context("no link was signed")
}

/// Why a download link is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LinkError {
    /// 403: the signature is missing, or not one this service made for this file and expiry.
    #[error("download link signature is missing or invalid")]
    BadSignature,
    /// 403: the link is past its `expires`.
    #[error("download link has expired")]
    Expired,
}

/// A link that checked out: the file it names and the second it stops working.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ValidLink {
    pub(crate) file_id: Uuid,
    pub(crate) expires: u64,
}

/// The first value of `name` in a raw query string (not percent-decoded: the values a link
/// carries are digits and hex, anything else fails the signature).
fn query_param<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find_map(|(key, value)| (key == name).then_some(value))
}

/// Checks the link for `file_id` with the raw query `query` at `now`: the signature first (in
/// constant time), then the expiry.
pub(crate) fn check(
    signer: &Signer,
    file_id: &str,
    query: Option<&str>,
    now: SystemTime,
) -> anyhow::Result<Result<ValidLink, LinkError>> {
    let query = query.unwrap_or_default();
    let (Some(expires), Some(signature)) = (
        query_param(query, "expires"),
        query_param(query, "signature"),
    ) else {
        return Ok(Err(LinkError::BadSignature));
    };
    let Ok(signature) = hex::decode(signature) else {
        return Ok(Err(LinkError::BadSignature));
    };
    let key = link_key(signer)?;
    if link_mac(&key, file_id, expires)
        .verify_slice(&signature)
        .is_err()
    {
        return Ok(Err(LinkError::BadSignature));
    }
    // Signed by us, so both parse; a link made by other code would be refused all the same.
    let (Ok(expires), Ok(file_id)) = (expires.parse::<u64>(), Uuid::parse_str(file_id)) else {
        return Ok(Err(LinkError::BadSignature));
    };
    if unix_secs(now) > expires {
        return Ok(Err(LinkError::Expired));
    }
    Ok(Ok(ValidLink { file_id, expires }))
}

/// The answer to a valid link for `file`: its object streamed from S3 (never buffered whole)
/// with the headers of the module doc, or `None` when the object is gone.
pub(crate) async fn serve(
    s3: &aws_sdk_s3::Client,
    file: &FileRow,
    link: ValidLink,
    now: SystemTime,
) -> anyhow::Result<Option<Response>> {
    let object = match s3
        .get_object()
        .bucket(&file.bucket)
        .key(&file.object_key)
        .send()
        .await
    {
        Ok(object) => object,
        Err(err)
            if err
                .as_service_error()
                .is_some_and(aws_sdk_s3::operation::get_object::GetObjectError::is_no_such_key) =>
        {
            return Ok(None);
        }
        Err(err) => return Err(aws_sdk_s3::Error::from(err)).context("cannot read the object"),
    };
    let content_type = known(&file.content_type).unwrap_or("application/octet-stream");
    let max_age = link.expires.saturating_sub(unix_secs(now));
    let mut response = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, HeaderValue::from_static(content_type))
        .header(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        )
        .header(
            header::CONTENT_DISPOSITION,
            HeaderValue::from_str(&disposition(content_type, &file.file_name))?,
        )
        .header(
            header::CACHE_CONTROL,
            HeaderValue::from_str(&format!("private, max-age={max_age}"))?,
        );
    // Not for raster images: nothing to run, and `<img>` and image documents show them inline.
    if !RASTER_IMAGES.contains(&content_type) {
        response = response.header(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("sandbox"),
        );
    }
    if let Some(length) = object.content_length().and_then(|n| u64::try_from(n).ok()) {
        response = response.header(header::CONTENT_LENGTH, length);
    }
    let body = futures::stream::try_unfold(object.body, |mut body| async move {
        Ok::<_, aws_sdk_s3::primitives::ByteStreamError>(
            body.try_next().await?.map(|chunk| (chunk, body)),
        )
    });
    Ok(Some(response.body(Body::from_stream(body))?))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use uuid::Uuid;

    use super::{LinkError, ValidLink, check, disposition, presign};
    use crate::policy::Signer;
    use crate::store::FileRow;

    fn signer_for(secret: &str) -> Signer {
        Signer {
            access_key: "AKIDEXAMPLE".to_owned(),
            secret_key: secret.into(),
            region: "eu-central-1".to_owned(),
            public_endpoint: "http://127.0.0.1:9000".to_owned(),
            download_base: "https://files.example.com/".to_owned(),
        }
    }

    fn file(id: u128, content_type: &str) -> FileRow {
        FileRow {
            id: Uuid::from_u128(id),
            bucket: "switchboard".to_owned(),
            object_key: format!("uploads/o/{id}/f"),
            file_name: "f".to_owned(),
            content_type: content_type.to_owned(),
            size_bytes: 1,
            declared_sha256: None,
            status: crate::store::FileStatus::Verified,
            expires_at: None,
        }
    }

    /// The path and raw query of a link.
    fn parts(link: &str) -> (&str, &str) {
        let rest = link
            .strip_prefix("https://files.example.com/v2/files/content/")
            .unwrap();
        rest.split_once('?').unwrap()
    }

    #[test]
    fn a_link_is_an_hmac_of_the_file_id_and_expiry_under_a_key_derived_from_the_s3_secret() {
        let now = UNIX_EPOCH + Duration::from_secs(1_795_340_000);
        let signer = signer_for("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
        let (a, b) = (file(1, "application/pdf"), file(2, "image/svg+xml"));
        let links = presign(
            &signer,
            [Some(&a), None, Some(&b)],
            Duration::from_secs(300),
            now,
        )
        .unwrap();
        assert_eq!(links.len(), 3);
        assert_eq!(links[1], None);
        let (id, query) = parts(links[0].as_deref().unwrap());
        assert_eq!(id, "00000000-0000-0000-0000-000000000001");
        // HMAC-SHA256(HMAC-SHA256(secret, label), "{id}:{expires}"), computed independently.
        assert_eq!(
            query,
            "expires=1795340300&signature=".to_owned()
                + &expected("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", id, "1795340300")
        );
        assert_eq!(
            check(&signer, id, Some(query), now).unwrap(),
            Ok(ValidLink {
                file_id: a.id,
                expires: 1_795_340_300
            })
        );
        let (id_b, query_b) = parts(links[2].as_deref().unwrap());
        assert!(check(&signer, id_b, Some(query_b), now).unwrap().is_ok());
    }

    /// HMAC-SHA256 by its definition (RFC 2104) over `sha2`, to check the `hmac` crate's use.
    fn hmac(key: &[u8], message: &[u8]) -> Vec<u8> {
        use sha2::{Digest, Sha256};
        let mut block = [0u8; 64];
        block[..key.len()].copy_from_slice(key);
        let pad = |byte: u8| block.iter().map(|k| k ^ byte).collect::<Vec<u8>>();
        let inner = Sha256::new()
            .chain_update(pad(0x36))
            .chain_update(message)
            .finalize();
        Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize()
            .to_vec()
    }

    fn expected(secret: &str, id: &str, expires: &str) -> String {
        let key = hmac(secret.as_bytes(), b"switchboard download links v1");
        hex::encode(hmac(&key, format!("{id}:{expires}").as_bytes()))
    }

    #[test]
    fn a_tampered_moved_extended_expired_or_foreign_link_is_refused() {
        let now = SystemTime::now();
        let signer = signer_for("secret-one");
        let (a, b) = (file(1, "image/png"), file(2, "text/plain"));
        let links = presign(&signer, [Some(&a), Some(&b)], Duration::from_secs(60), now).unwrap();
        let (id, query) = parts(links[0].as_deref().unwrap());
        let (other_id, _) = parts(links[1].as_deref().unwrap());
        let expires = query
            .split_once('&')
            .unwrap()
            .0
            .strip_prefix("expires=")
            .unwrap();
        let signature = query.rsplit_once('=').unwrap().1;
        let flipped = format!(
            "{}{}",
            if signature.starts_with('0') { "1" } else { "0" },
            &signature[1..]
        );
        let later = (expires.parse::<u64>().unwrap() + 3600).to_string();
        let cases = [
            (
                "signature flipped",
                id,
                format!("expires={expires}&signature={flipped}"),
            ),
            (
                "expires extended",
                id,
                format!("expires={later}&signature={signature}"),
            ),
            ("another file's id", other_id, query.to_owned()),
            ("no signature", id, format!("expires={expires}")),
            ("no expires", id, format!("signature={signature}")),
            (
                "signature not hex",
                id,
                format!("expires={expires}&signature=zz"),
            ),
            (
                "signature cut short",
                id,
                format!("expires={expires}&signature={}", &signature[..32]),
            ),
        ];
        for (what, id, query) in cases {
            assert_eq!(
                check(&signer, id, Some(&query), now).unwrap(),
                Err(LinkError::BadSignature),
                "{what}"
            );
        }
        assert_eq!(
            check(&signer, id, None, now).unwrap(),
            Err(LinkError::BadSignature)
        );
        assert_eq!(
            check(&signer_for("secret-two"), id, Some(query), now).unwrap(),
            Err(LinkError::BadSignature),
            "another S3 secret, another key"
        );
        assert!(
            check(&signer, id, Some(query), now + Duration::from_secs(60))
                .unwrap()
                .is_ok(),
            "valid to the end of its last second"
        );
        assert_eq!(
            check(&signer, id, Some(query), now + Duration::from_secs(62)).unwrap(),
            Err(LinkError::Expired)
        );
    }

    #[test]
    fn only_types_safe_to_render_are_inline_and_names_are_encoded() {
        for inline in [
            "image/png",
            "image/jpeg",
            "image/gif",
            "image/webp",
            "image/bmp",
            "text/plain",
            "text/csv; charset=utf-8",
        ] {
            assert!(disposition(inline, "a").starts_with("inline;"), "{inline}");
        }
        for attachment in [
            "application/pdf",
            "image/svg+xml",
            "text/html",
            "application/msword",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            "application/vnd.ms-excel",
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
            "application/vnd.ms-powerpoint",
            "application/vnd.openxmlformats-officedocument.presentationml.presentation",
            "application/octet-stream",
        ] {
            assert!(
                disposition(attachment, "a").starts_with("attachment;"),
                "{attachment}"
            );
        }
        let d = disposition("application/pdf", "báo \"cáo\".pdf");
        assert!(d.contains("filename=\"b_o _c_o_.pdf\""), "{d}");
        assert!(
            d.contains("filename*=UTF-8''b%C3%A1o%20%22c%C3%A1o%22%2Epdf"),
            "{d}"
        );
    }
}
