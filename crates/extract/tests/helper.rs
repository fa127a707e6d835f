//! The `switchboard-extract` helper as the worker runs it: a process per file that reads a
//! request on standard input, confines itself, and replies on standard output; a file that
//! needs more memory than allowed ends the helper, not its caller.

use std::io::{Read as _, Write as _};
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, ExitStatus, Stdio};

use extract::isolate::{Reply, Request};
use extract::{Extracted, Limits, bombs};

/// What the helper did: its exit status, standard output and standard error.
type Outcome = (ExitStatus, Vec<u8>, String);

/// Runs the helper on `bytes` with an address-space limit of `memory_mib` (0: none).
fn helper(mime: &str, name: &str, bytes: &[u8], memory_mib: u64) -> std::io::Result<Outcome> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchboard-extract"))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let request = Request {
        mime_type: mime.to_owned(),
        file_name: name.to_owned(),
        limits: Limits::default(),
        memory_bytes: memory_mib << 20,
        size: bytes.len() as u64,
    };
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("no pipes"));
    };
    let header = request.header();
    let bytes = bytes.to_vec();
    // Written from a thread: the helper may stop reading (and die) halfway.
    let writer = std::thread::spawn(move || {
        let _ = stdin
            .write_all(&header)
            .and_then(|()| stdin.write_all(&bytes));
    });
    let mut out = Vec::new();
    stdout.read_to_end(&mut out)?;
    let mut err = String::new();
    stderr.read_to_string(&mut err)?;
    let status = child.wait()?;
    writer
        .join()
        .map_err(|_| std::io::Error::other("the writer panicked"))?;
    Ok((status, out, err))
}

#[test]
fn the_helper_extracts_a_file_sent_on_its_standard_input_and_reports_its_peak_memory() {
    let (status, out, err) = helper("text/csv", "a.csv", b"a,b\n1,2\n", 384).unwrap();
    assert!(status.success(), "{status}: {err}");
    let reply = Reply::decode(&out).unwrap();
    assert_eq!(
        reply.result,
        Ok(Extracted::Text {
            text: "a,b\n1,2\n".into(),
            truncated: false
        })
    );
    assert!(reply.peak_rss_kib > 0, "VmHWM is read from /proc");
}

#[test]
fn a_refusal_inside_the_helper_comes_back_as_the_reason() {
    let (status, out, err) =
        helper("image/bmp", "bomb.bmp", &bombs::bmp_rle8(9000, 9000), 384).unwrap();
    assert!(status.success(), "{status}: {err}");
    assert_eq!(
        Reply::decode(&out).unwrap().result,
        Err("the image declares 9000x9000 pixels, over the 67-megapixel limit".to_owned())
    );
}

#[test]
fn a_49_kb_pdf_that_needs_gigabytes_ends_its_helper_at_the_memory_limit() {
    // Its page content inflates to 48 MiB of `0 ` operands (under the decompression cap),
    // which lopdf turns into 25 million objects: 2.9 GB in process before issue 14.
    let pdf = bombs::pdf_flate_page(48 * 1024 * 1024);
    assert!(pdf.len() < 64 * 1024, "{} bytes", pdf.len());
    let (status, out, err) = helper("application/pdf", "tokens.pdf", &pdf, 256).unwrap();
    assert!(out.is_empty(), "no reply from a helper past its limit");
    assert_eq!(status.signal(), Some(6), "aborted: {status}, {err}");
    assert!(err.contains("memory allocation of"), "{err}");
}

#[test]
fn a_pdf_of_object_streams_that_expand_while_loading_ends_its_helper_too() {
    let pdf = bombs::pdf_object_streams(4, 16 * 1024 * 1024);
    let (status, _, err) = helper("application/pdf", "objstm.pdf", &pdf, 256).unwrap();
    assert_eq!(status.signal(), Some(6), "aborted: {status}, {err}");
    assert!(err.contains("memory allocation of"), "{err}");
}

#[test]
fn a_legitimate_large_pdf_fits_the_default_memory_limit() {
    // 20 pages each holding a 1 MB scan: lopdf keeps every stream, about twice the file.
    let pdf = bombs::pdf_with_images(20, 1000 * 1000);
    let (status, out, err) = helper("application/pdf", "scans.pdf", &pdf, 384).unwrap();
    assert!(status.success(), "{status}: {err}");
    let reply = Reply::decode(&out).unwrap();
    let Ok(Extracted::Text { text, truncated }) = reply.result else {
        panic!("expected text, got {:?}", reply.result);
    };
    assert!(!truncated);
    assert!(text.contains("Scanned page 20 of 20"), "{text}");
}

#[test]
fn legacy_office_files_are_read_inside_the_helper_and_their_bombs_refused_there() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/");
    for (mime, file, expected) in [
        ("application/msword", "libreoffice.doc", "Report title\n"),
        (
            "application/vnd.ms-excel",
            "libreoffice.xls",
            "--- Sheet: Summary ---\n",
        ),
        (
            "application/vnd.ms-powerpoint",
            "libreoffice.ppt",
            "--- Slide 1 ---\n",
        ),
    ] {
        let bytes = std::fs::read(format!("{fixtures}{file}")).unwrap();
        let (status, out, err) = helper(mime, file, &bytes, 384).unwrap();
        assert!(status.success(), "{file}: {status}: {err}");
        let reply = Reply::decode(&out).unwrap();
        let Ok(Extracted::Text { text, .. }) = reply.result else {
            panic!("{file}: expected text, got {:?}", reply.result);
        };
        assert!(text.starts_with(expected), "{file}: {text}");
    }
    // 2.5 KB declaring 4 x 16.8 million cells: refused from its records, in a few MiB.
    let (status, out, err) = helper(
        "application/vnd.ms-excel",
        "corners.xls",
        &bombs::xls_far_corners(4),
        64,
    )
    .unwrap();
    assert!(status.success(), "{status}: {err}");
    let reply = Reply::decode(&out).unwrap();
    assert!(
        matches!(&reply.result, Ok(Extracted::Unsupported { reason }) if reason.contains("65536 rows by 256 columns")),
        "{:?}",
        reply.result
    );
}

#[test]
fn a_stale_or_foreign_request_is_refused_without_a_reply() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchboard-extract"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"SBX0 something else")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("bad magic"),
        "{output:?}"
    );
}
