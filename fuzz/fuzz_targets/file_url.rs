//! Fuzz target: an untrusted file reference, `switchboard_protocol::files::parse_file_url`
//! (`s3://bucket/key`, a presigned path-style S3 URL, a Supabase signed URL).
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run file_url -- -max_total_time=60` (see docs/testing.md).
//!
//! Properties (exactly what the function promises, no more): it never panics; an accepted URL
//! is at most `MAX_FILE_URL_LEN` bytes, had no `%2e` (dot segments are refused, not resolved),
//! and yields a non-empty bucket and a non-empty path whose `/`-separated segments are none
//! empty, `.` or `..` (so no leading or trailing `/`, no `//`), with no `/` in the bucket and
//! no control character in either (this target found both; the function now refuses them).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchboard_protocol::files::{FileRefError, MAX_FILE_URL_LEN, parse_file_url};

fuzz_target!(|data: &[u8]| {
    let raw = String::from_utf8_lossy(data);
    match parse_file_url(&raw) {
        Ok(file) => {
            assert!(raw.len() <= MAX_FILE_URL_LEN);
            assert!(!raw.to_ascii_lowercase().contains("%2e"), "{raw:?}");
            assert!(!file.bucket.is_empty(), "empty bucket from {raw:?}");
            assert!(!file.path.is_empty(), "empty path from {raw:?}");
            assert!(!file.bucket.contains('/'), "a / in the bucket from {raw:?}");
            assert!(
                !file.bucket.chars().chain(file.path.chars()).any(char::is_control),
                "a control character from {raw:?}"
            );
            for segment in file.path.split('/') {
                assert!(
                    !segment.is_empty() && segment != "." && segment != "..",
                    "segment {segment:?} in path {:?} from {raw:?}",
                    file.path
                );
            }
        }
        Err(FileRefError::TooLong) => assert!(raw.len() > MAX_FILE_URL_LEN),
        Err(FileRefError::Unsupported) => assert!(raw.len() <= MAX_FILE_URL_LEN),
    }
});
