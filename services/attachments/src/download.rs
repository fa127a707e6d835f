//! Signed download URLs: minted fresh on every read, short-lived, and active content (SVG,
//! anything HTML-like) always as an attachment, never inline.

use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use aws_sdk_s3::config::Credentials;
use aws_sigv4::http_request::{
    PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation, SigningParams,
    SigningSettings, UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use protocol::file_types;

use secrecy::ExposeSecret as _;

use crate::policy::Signer;
use crate::store::FileRow;

/// `Content-Disposition` for a file: `attachment` for active or unknown types, else `inline`,
/// with the name in RFC 6266 / RFC 5987 form.
pub(crate) fn disposition(content_type: &str, file_name: &str) -> String {
    let inline = file_types::allowed(content_type).is_some_and(|t| !t.active);
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

/// The characters the AWS SDK percent-encodes in path labels and query values (the `BASE_SET`
/// of `aws-smithy-http`), so the URLs are byte for byte the ones its presigner makes.
const SMITHY_SET: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'/')
    .add(b':')
    .add(b',')
    .add(b'?')
    .add(b'#')
    .add(b'[')
    .add(b']')
    .add(b'{')
    .add(b'}')
    .add(b'|')
    .add(b'@')
    .add(b'!')
    .add(b'$')
    .add(b'&')
    .add(b'\'')
    .add(b'(')
    .add(b')')
    .add(b'*')
    .add(b'+')
    .add(b';')
    .add(b'=')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'"')
    .add(b'^')
    .add(b'`')
    .add(b'\\');
/// An object key in the path: `/` kept between its segments (a "greedy" label).
const SMITHY_KEY_SET: &AsciiSet = &SMITHY_SET.remove(b'/');

/// Presigned GET URLs (SigV4, query-string signature, `UNSIGNED-PAYLOAD`) for `files`, in
/// order, `None` staying `None`: path style on the signer's public endpoint, valid for `ttl`
/// from `now`, with the response Content-Type and Content-Disposition pinned. What the AWS SDK
/// presigner makes for `GetObject`, without its per-request pipeline.
pub(crate) fn presign<'a>(
    signer: &Signer,
    files: impl IntoIterator<Item = Option<&'a FileRow>>,
    ttl: Duration,
    now: SystemTime,
) -> anyhow::Result<Vec<Option<String>>> {
    let identity = Credentials::new(
        &signer.access_key,
        signer.secret_key.expose_secret(),
        None,
        None,
        "switchboard-download",
    )
    .into();
    let mut settings = SigningSettings::default();
    // As S3 expects (and the SDK signs for S3): the path as sent, not normalized.
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(ttl);
    let params: SigningParams<'_> = v4::SigningParams::builder()
        .identity(&identity)
        .region(&signer.region)
        .name("s3")
        .time(now)
        .settings(settings)
        .build()?
        .into();
    let endpoint = signer.public_endpoint.trim_end_matches('/');
    files
        .into_iter()
        .map(|file| {
            file.map(|file| presign_one(&params, endpoint, file))
                .transpose()
        })
        .collect()
}

fn presign_one(
    params: &SigningParams<'_>,
    endpoint: &str,
    file: &FileRow,
) -> anyhow::Result<String> {
    let url = format!(
        "{endpoint}/{bucket}/{key}?x-id=GetObject&response-content-disposition={disposition}&response-content-type={content_type}",
        bucket = utf8_percent_encode(&file.bucket, SMITHY_SET),
        key = utf8_percent_encode(&file.object_key, SMITHY_KEY_SET),
        disposition = utf8_percent_encode(
            &disposition(&file.content_type, &file.file_name),
            SMITHY_SET
        ),
        content_type = utf8_percent_encode(&file.content_type, SMITHY_SET),
    );
    let signable = SignableRequest::new(
        "GET",
        url.as_str(),
        std::iter::empty(),
        SignableBody::UnsignedPayload,
    )?;
    let (instructions, _signature) = aws_sigv4::http_request::sign(signable, params)?.into_parts();
    let mut request = axum::http::Request::builder().uri(&url).body(())?;
    instructions.apply_to_request_http1x(&mut request);
    Ok(request.uri().to_string())
}

/// A presigned GET URL for `file`, valid for `ttl` from now.
pub(crate) fn sign(signer: &Signer, file: &FileRow, ttl: Duration) -> anyhow::Result<String> {
    presign(signer, [Some(file)], ttl, SystemTime::now())
        .map(|urls| urls.into_iter().flatten().next())?
        .context("no URL was signed")
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
    use aws_sdk_s3::presigning::PresigningConfig;
    use secrecy::ExposeSecret as _;
    use uuid::Uuid;

    use super::{disposition, presign};
    use crate::policy::Signer;
    use crate::store::FileRow;

    fn signer(endpoint: &str) -> Signer {
        Signer {
            access_key: "AKIDEXAMPLE".to_owned(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            region: "eu-central-1".to_owned(),
            public_endpoint: endpoint.to_owned(),
        }
    }

    fn file(key: &str, name: &str, content_type: &str) -> FileRow {
        FileRow {
            id: Uuid::nil(),
            bucket: "switchboard".to_owned(),
            object_key: key.to_owned(),
            file_name: name.to_owned(),
            content_type: content_type.to_owned(),
            size_bytes: 1,
            declared_sha256: None,
            status: "verified".to_owned(),
            expires_at: None,
        }
    }

    /// What the AWS SDK presigner makes for the same object, time and validity.
    async fn sdk_url(signer: &Signer, file: &FileRow, now: SystemTime, ttl: Duration) -> String {
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(signer.region.clone()))
            .credentials_provider(Credentials::new(
                &signer.access_key,
                signer.secret_key.expose_secret(),
                None,
                None,
                "test",
            ))
            .endpoint_url(&signer.public_endpoint)
            .force_path_style(true)
            .build();
        let presigning = PresigningConfig::builder()
            .start_time(now)
            .expires_in(ttl)
            .build()
            .unwrap();
        aws_sdk_s3::Client::from_conf(config)
            .get_object()
            .bucket(&file.bucket)
            .key(&file.object_key)
            .response_content_type(&file.content_type)
            .response_content_disposition(disposition(&file.content_type, &file.file_name))
            .presigned(presigning)
            .await
            .unwrap()
            .uri()
            .to_owned()
    }

    #[tokio::test]
    async fn urls_are_byte_identical_to_the_sdk_presigner() {
        let now = UNIX_EPOCH + Duration::from_secs(1_795_340_000);
        let ttl = Duration::from_secs(300);
        let files = [
            file(
                "uploads/owner-1/0198a5b2-1111-7000-8000-000000000001/report.pdf",
                "report.pdf",
                "application/pdf",
            ),
            file(
                "uploads/o/0198a5b2-1111-7000-8000-000000000002/b\u{e1}o c\u{e1}o (1)+x;y=z,t@!$'*~.svg",
                "b\u{e1}o \"c\u{e1}o\" (1).svg",
                "image/svg+xml",
            ),
            file("generated/abc/x/a b%20c.png", "a b%20c.png", "image/png"),
            file("k", "unknown.bin", "application/x-unknown; charset=utf-8"),
        ];
        for endpoint in [
            "http://127.0.0.1:9000",
            "http://127.0.0.1:9000/",
            "https://s3.eu-central-1.amazonaws.com",
        ] {
            let signer = signer(endpoint);
            let ours = presign(&signer, files.iter().map(Some), ttl, now).unwrap();
            for (file, ours) in files.iter().zip(ours) {
                let sdk = sdk_url(&signer, file, now, ttl).await;
                assert_eq!(
                    ours.as_deref(),
                    Some(sdk.as_str()),
                    "{endpoint} {}",
                    file.object_key
                );
            }
        }
    }

    #[test]
    fn a_batch_keeps_order_and_gaps() {
        let now = SystemTime::now();
        let (a, b) = (
            file("a/1.pdf", "1.pdf", "application/pdf"),
            file("a/2.svg", "2.svg", "image/svg+xml"),
        );
        let urls = presign(
            &signer("http://s3.local:9000"),
            [Some(&a), None, Some(&b), Some(&a)],
            Duration::from_secs(60),
            now,
        );
        let urls = urls.unwrap();
        assert_eq!(urls.len(), 4);
        assert!(urls[0].as_deref().is_some_and(|u| u.starts_with("http://s3.local:9000/switchboard/a/1.pdf?x-id=GetObject&response-content-disposition=inline")));
        assert_eq!(urls[1], None);
        assert!(
            urls[2]
                .as_deref()
                .is_some_and(|u| u.contains("/switchboard/a/2.svg?")
                    && u.contains("disposition=attachment")
                    && u.contains("X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature="))
        );
        assert_eq!(urls[3], urls[0]);
    }

    #[test]
    fn active_content_is_an_attachment_and_names_are_encoded() {
        assert!(disposition("image/svg+xml", "a.svg").starts_with("attachment;"));
        assert!(disposition("text/html", "a.html").starts_with("attachment;"));
        assert!(disposition("image/png", "a.png").starts_with("inline;"));
        let d = disposition("application/pdf", "báo \"cáo\".pdf");
        assert!(d.contains("filename=\"b_o _c_o_.pdf\""), "{d}");
        assert!(
            d.contains("filename*=UTF-8''b%C3%A1o%20%22c%C3%A1o%22%2Epdf"),
            "{d}"
        );
    }
}
