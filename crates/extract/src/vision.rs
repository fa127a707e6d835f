//! Images for vision blocks: PNG, JPEG, GIF and WebP as they are (never decoded here);
//! BMP converted to PNG. Every PNG, GIF and BMP header's dimensions are checked first: a
//! few bytes can declare gigapixels, which a BMP decoder would allocate.

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

/// Width and height a PNG (IHDR) or GIF (logical screen) header declares.
fn declared_size(mime_type: &str, bytes: &[u8]) -> Option<(u32, u32)> {
    let be = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    match mime_type {
        "image/png" if bytes.get(12..16) == Some(b"IHDR") => Some((be(16)?, be(20)?)),
        "image/gif" => {
            let b = bytes.get(6..10)?;
            Some((
                u32::from(u16::from_le_bytes([b[0], b[1]])),
                u32::from(u16::from_le_bytes([b[2], b[3]])),
            ))
        }
        _ => None,
    }
}

/// Refuses an image declaring more than [`Limits::max_image_pixels`].
fn check_pixels(width: u32, height: u32, limits: &Limits) -> Result<(), ExtractError> {
    let pixels = u64::from(width) * u64::from(height);
    if pixels > limits.max_image_pixels {
        return Err(ExtractError::ImageTooLarge {
            width,
            height,
            why: format!(
                "over the {}-megapixel limit",
                limits.max_image_pixels / 1_000_000
            ),
        });
    }
    Ok(())
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
    if let Some((width, height)) = declared_size(actual, bytes) {
        check_pixels(width, height, limits)?;
    }
    block(actual, bytes, limits)
}

#[cfg(feature = "bmp")]
/// A BMP converted to a PNG vision block (vision models do not take BMP). Its header is
/// read first: a BMP whose pixels would take more than
/// [`Limits::max_decoded_image_bytes`] as RGBA is refused without decoding (RLE lets
/// 1 KiB declare 9000x9000, 309 MiB of RGBA).
pub(crate) fn bmp_to_png(bytes: &[u8], limits: &Limits) -> Result<Extracted, ExtractError> {
    use std::io::Cursor;

    let reader = || image::ImageReader::with_format(Cursor::new(bytes), image::ImageFormat::Bmp);
    let (width, height) = reader()
        .into_dimensions()
        .map_err(|e| ExtractError::corrupt("BMP", e))?;
    check_pixels(width, height, limits)?;
    let decoded_bytes = u64::from(width) * u64::from(height) * 4;
    if decoded_bytes > limits.max_decoded_image_bytes {
        return Err(ExtractError::ImageTooLarge {
            width,
            height,
            why: format!(
                "which would take {} MiB to decode, over the {} MiB limit",
                decoded_bytes.div_ceil(MIB),
                limits.max_decoded_image_bytes / MIB
            ),
        });
    }
    let mut reader = reader();
    let mut bounds = image::Limits::default();
    // The header check above is the real bound; this one catches a decoder that
    // allocates more than the pixels (e.g. a scratch row buffer) beyond a margin.
    bounds.max_alloc = Some(limits.max_decoded_image_bytes.saturating_add(MIB));
    bounds.max_image_width = Some(width);
    bounds.max_image_height = Some(height);
    reader.limits(bounds);
    let decoded = reader
        .decode()
        .map_err(|e| ExtractError::corrupt("BMP", e))?;
    let mut png = Vec::new();
    decoded
        .write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
        .map_err(|e| ExtractError::corrupt("BMP", format!("converting to PNG: {e}")))?;
    drop(decoded);
    block("image/png", &png, limits)
}

#[cfg(feature = "bmp")]
const MIB: u64 = 1024 * 1024;
