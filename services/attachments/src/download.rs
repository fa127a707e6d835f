//! Signed download URLs: minted fresh on every read, short-lived, and active content (SVG,
//! anything HTML-like) always as an attachment, never inline.

use std::time::Duration;

use aws_sdk_s3::presigning::PresigningConfig;
use protocol::file_types;

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

/// A presigned GET URL for `file`, valid for `ttl`.
pub(crate) async fn sign(
    presign: &aws_sdk_s3::Client,
    file: &FileRow,
    ttl: Duration,
) -> anyhow::Result<String> {
    let request = presign
        .get_object()
        .bucket(&file.bucket)
        .key(&file.object_key)
        .response_content_type(&file.content_type)
        .response_content_disposition(disposition(&file.content_type, &file.file_name))
        .presigned(PresigningConfig::expires_in(ttl)?)
        .await?;
    Ok(request.uri().to_owned())
}

#[cfg(test)]
mod tests {
    use super::disposition;

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
