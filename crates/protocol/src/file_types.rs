//! The file types `file-attachments.md` allows, and what their bytes must look like.

/// One allowed type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileType {
    /// MIME type clients declare.
    pub mime: &'static str,
    /// Icon type the history shows (`pdf`, `image`, `excel`, ...).
    pub icon: &'static str,
    /// Whether browsers could run it as active content (served as an attachment, never inline).
    pub active: bool,
    magic: Magic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Magic {
    Prefix(&'static [u8]),
    /// MPEG audio: an ID3 tag, or a frame sync.
    Mp3,
    /// `RIFF....WAVE`.
    Wav,
    /// An ISO media file (`....ftyp`), as `.m4a` is.
    Ftyp,
    Ole,
    Zip,
    Gif,
    Webp,
    Svg,
    Text,
}

const OLE: &[u8] = &[0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1];

/// Every allowed type: PDF, DOC/DOCX, XLS/XLSX, PPT/PPTX, PNG, JPEG, GIF, WebP, BMP, SVG, CSV,
/// TXT (the twelve of `file-attachments.md`), and audio (MP3, WAV, OGG, WebM, M4A, FLAC: a seed
/// deviation, for AG-UI's `audio` parts).
pub const ALLOWED: &[FileType] = &[
    FileType {
        mime: "application/pdf",
        icon: "pdf",
        active: false,
        magic: Magic::Prefix(b"%PDF-"),
    },
    FileType {
        mime: "application/msword",
        icon: "word",
        active: false,
        magic: Magic::Ole,
    },
    FileType {
        mime: "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        icon: "word",
        active: false,
        magic: Magic::Zip,
    },
    FileType {
        mime: "application/vnd.ms-excel",
        icon: "excel",
        active: false,
        magic: Magic::Ole,
    },
    FileType {
        mime: "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        icon: "excel",
        active: false,
        magic: Magic::Zip,
    },
    FileType {
        mime: "application/vnd.ms-powerpoint",
        icon: "powerpoint",
        active: false,
        magic: Magic::Ole,
    },
    FileType {
        mime: "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        icon: "powerpoint",
        active: false,
        magic: Magic::Zip,
    },
    FileType {
        mime: "image/png",
        icon: "image",
        active: false,
        magic: Magic::Prefix(b"\x89PNG\r\n\x1a\n"),
    },
    FileType {
        mime: "image/jpeg",
        icon: "image",
        active: false,
        magic: Magic::Prefix(&[0xFF, 0xD8, 0xFF]),
    },
    FileType {
        mime: "image/gif",
        icon: "image",
        active: false,
        magic: Magic::Gif,
    },
    FileType {
        mime: "image/webp",
        icon: "image",
        active: false,
        magic: Magic::Webp,
    },
    FileType {
        mime: "image/bmp",
        icon: "image",
        active: false,
        magic: Magic::Prefix(b"BM"),
    },
    FileType {
        mime: "image/svg+xml",
        icon: "image",
        active: true,
        magic: Magic::Svg,
    },
    FileType {
        mime: "audio/mpeg",
        icon: "audio",
        active: false,
        magic: Magic::Mp3,
    },
    FileType {
        mime: "audio/wav",
        icon: "audio",
        active: false,
        magic: Magic::Wav,
    },
    FileType {
        mime: "audio/ogg",
        icon: "audio",
        active: false,
        magic: Magic::Prefix(b"OggS"),
    },
    FileType {
        mime: "audio/webm",
        icon: "audio",
        active: false,
        magic: Magic::Prefix(&[0x1A, 0x45, 0xDF, 0xA3]),
    },
    FileType {
        mime: "audio/mp4",
        icon: "audio",
        active: false,
        magic: Magic::Ftyp,
    },
    FileType {
        mime: "audio/flac",
        icon: "audio",
        active: false,
        magic: Magic::Prefix(b"fLaC"),
    },
    FileType {
        mime: "text/csv",
        icon: "csv",
        active: false,
        magic: Magic::Text,
    },
    FileType {
        mime: "text/plain",
        icon: "txt",
        active: false,
        magic: Magic::Text,
    },
];

/// The allowed type with this MIME type (case-insensitive, parameters ignored).
pub fn allowed(mime: &str) -> Option<&'static FileType> {
    let bare = mime.split(';').next().unwrap_or_default().trim();
    ALLOWED.iter().find(|t| t.mime.eq_ignore_ascii_case(bare))
}

impl FileType {
    /// Whether `head` (the first bytes of the file, up to 4 KiB) looks like this type.
    pub fn matches(&self, head: &[u8]) -> bool {
        match self.magic {
            Magic::Prefix(prefix) => head.starts_with(prefix),
            Magic::Mp3 => {
                head.starts_with(b"ID3")
                    || (head.len() >= 2 && head[0] == 0xFF && head[1] & 0xE0 == 0xE0)
            }
            Magic::Wav => head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WAVE",
            Magic::Ftyp => head.len() >= 8 && &head[4..8] == b"ftyp",
            Magic::Ole => head.starts_with(OLE),
            Magic::Zip => head.starts_with(b"PK\x03\x04"),
            Magic::Gif => head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a"),
            Magic::Webp => head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP",
            Magic::Svg => text(head).is_some_and(|t| {
                let t = t.trim_start_matches('\u{feff}').trim_start();
                t.starts_with('<') && t.contains("<svg")
            }),
            Magic::Text => text(head).is_some(),
        }
    }
}

/// `head` as text: UTF-8 (a character cut at the end is fine) without NUL bytes.
fn text(head: &[u8]) -> Option<&str> {
    if head.contains(&0) {
        return None;
    }
    match std::str::from_utf8(head) {
        Ok(t) => Some(t),
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok(),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(mime: &str) -> &'static FileType {
        allowed(mime).unwrap_or_else(|| unreachable!("{mime} is allowed"))
    }

    #[test]
    fn each_type_accepts_its_own_signature_and_refuses_another() {
        let png = b"\x89PNG\r\n\x1a\nrest";
        assert!(kind("image/png").matches(png));
        assert!(!kind("image/jpeg").matches(png));
        assert!(kind("application/pdf").matches(b"%PDF-1.7\n"));
        assert!(!kind("application/pdf").matches(b"<html>"));
        assert!(kind("image/webp").matches(b"RIFF\x10\0\0\0WEBPVP8 "));
        assert!(kind("image/svg+xml").matches(b"<?xml version=\"1.0\"?><svg xmlns=\"...\"/>"));
        assert!(!kind("image/svg+xml").matches(b"hello"));
        assert!(kind("text/plain").matches("héllo".as_bytes()));
        assert!(
            kind("text/plain").matches(&"é".as_bytes()[..1]),
            "a character cut at the end is fine"
        );
        assert!(!kind("text/csv").matches(b"a,b\0c"));
        assert!(
            kind("application/vnd.openxmlformats-officedocument.wordprocessingml.document")
                .matches(b"PK\x03\x04....")
        );
    }

    #[test]
    fn audio_files_are_recognised_by_their_signatures() {
        assert!(kind("audio/mpeg").matches(b"ID3\x04\0\0"));
        assert!(kind("audio/mpeg").matches(&[0xFF, 0xFB, 0x90, 0x64]));
        assert!(!kind("audio/mpeg").matches(b"%PDF-1.7"));
        assert!(kind("audio/wav").matches(b"RIFF\x24\0\0\0WAVEfmt "));
        assert!(!kind("audio/wav").matches(b"RIFF\x10\0\0\0WEBPVP8 "));
        assert!(kind("audio/ogg").matches(b"OggS\0\x02"));
        assert!(kind("audio/webm").matches(&[0x1A, 0x45, 0xDF, 0xA3, 0x9F]));
        assert!(kind("audio/mp4").matches(b"\0\0\0\x20ftypM4A \0\0\0\0"));
        assert!(kind("audio/flac").matches(b"fLaC\0\0\0\x22"));
        assert_eq!(kind("audio/flac").icon, "audio");
    }

    #[test]
    fn unknown_types_are_not_allowed_and_parameters_are_ignored() {
        assert!(allowed("text/html").is_none());
        assert!(allowed("application/x-msdownload").is_none());
        assert_eq!(
            allowed("Text/Plain; charset=utf-8").map(|t| t.mime),
            Some("text/plain")
        );
        assert!(kind("image/svg+xml").active);
    }
}
