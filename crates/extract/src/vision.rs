//! Images for vision blocks: PNG, JPEG, GIF and WebP as they are; BMP converted to PNG.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::{ExtractError, Extracted, Limits};

/// The vision-ready type these bytes actually are, from their signature.
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

fn block(mime_type: &str, bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    if bytes.len() > limits.max_image_bytes {
        return Err(ExtractError::TooLarge {
            what: "the image",
            size: bytes.len(),
            limit: limits.max_image_bytes,
        });
    }
    Ok(Extracted::Image {
        mime_type: mime_type.to_owned(),
        data_base64: STANDARD.encode(bytes),
    })
}

/// A PNG, JPEG, GIF or WebP image as a vision block. The MIME type sent is the one
/// the bytes' signature shows (a mislabelled image is sent under its real type); bytes
/// that are none of these are corrupt.
pub(crate) fn passthrough(
    declared: &'static str,
    bytes: &[u8],
    limits: &Limits,
) -> Result<Extracted, ExtractError> {
    let format = match declared {
        "image/png" => "PNG",
        "image/jpeg" => "JPEG",
        "image/gif" => "GIF",
        _ => "WebP",
    };
    let Some(actual) = sniff(bytes) else {
        return Err(ExtractError::corrupt(
            format,
            "the bytes are not a PNG, JPEG, GIF or WebP image",
        ));
    };
    block(actual, bytes, limits)
}

#[cfg(feature = "bmp")]
/// Most memory decoding one BMP may take (64 megapixels of RGBA).
const MAX_BMP_ALLOC: u64 = 256 * 1024 * 1024;

#[cfg(feature = "bmp")]
/// A BMP converted to a PNG vision block (vision models do not take BMP).
pub(crate) fn bmp_to_png(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    use std::io::Cursor;

    let mut reader = image::ImageReader::with_format(Cursor::new(bytes), image::ImageFormat::Bmp);
    let mut bounds = image::Limits::default();
    bounds.max_alloc = Some(MAX_BMP_ALLOC);
    reader.limits(bounds);
    let decoded = reader
        .decode()
        .map_err(|e| ExtractError::corrupt("BMP", e))?;
    let mut png = Vec::new();
    decoded
        .write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
        .map_err(|e| ExtractError::corrupt("BMP", format!("converting to PNG: {e}")))?;
    block("image/png", &png, limits)
}
