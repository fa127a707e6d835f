//! The attachments service's quotas and S3 uploads hold under concurrency and cut connections
//! (issue 25; review findings L2 and L3; L1 is tested in `services/attachments/src/verify.rs`,
//! step by step against the real S3): many requests of one owner at once never overshoot the
//! unfinished-upload, file or byte limits, and a server upload cut by its client leaves no
//! multipart upload behind in S3.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use secrecy::ExposeSecret as _;
use serde_json::{Value, json};
use switchboard_system_tests::{EVENTUAL, TestPlatform};
use tokio::io::AsyncWriteExt as _;

const MIB: usize = 1024 * 1024;
/// Requests each owner fires at once.
const AT_ONCE: usize = 40;

/// `POST /v2/files/upload-url` for `file_name` of `file_size` bytes: the status and body.
async fn upload_url(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    file_name: String,
    file_size: u64,
) -> (u16, Value) {
    let response = http
        .post(format!("{base}/v2/files/upload-url"))
        .bearer_auth(token)
        .json(&json!({"file_name": file_name, "file_type": "text/plain", "file_size": file_size}))
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

/// [`AT_ONCE`] `upload-url` requests at once, for `<prefix><n>.txt` of `file_size` bytes.
async fn upload_urls(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    prefix: &str,
    file_size: u64,
) -> Vec<(u16, Value)> {
    futures::future::join_all(
        (0..AT_ONCE).map(|n| upload_url(http, base, token, format!("{prefix}{n}.txt"), file_size)),
    )
    .await
}

/// `POST /api/v1/agent/attachments` of `bytes` as text named `file_name`: the status and body.
async fn server_upload(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    file_name: String,
    bytes: Vec<u8>,
) -> (u16, Value) {
    let part = reqwest::multipart::Part::bytes(bytes)
        .file_name(file_name)
        .mime_str("text/plain")
        .unwrap();
    let response = http
        .post(format!("{base}/api/v1/agent/attachments"))
        .bearer_auth(token)
        .multipart(reqwest::multipart::Form::new().part("file", part))
        .send()
        .await
        .unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

/// How many answers had each status, and the `error` of one answer per status (`null` for a
/// success).
fn tally(answers: &[(u16, Value)]) -> std::collections::BTreeMap<u16, (usize, Value)> {
    let mut tally = std::collections::BTreeMap::new();
    for (status, body) in answers {
        tally
            .entry(*status)
            .or_insert_with(|| (0, body["error"].clone()))
            .0 += 1;
    }
    tally
}

#[tokio::test]
async fn forty_concurrent_uploads_of_one_owner_never_overshoot_the_pending_file_or_byte_limits() {
    const MAX_PENDING: i64 = 3;
    const MAX_FILES: i64 = 5;
    const MAX_BYTES: i64 = 100;
    let platform = TestPlatform::spawn_with(switchboard_system_tests::Options {
        quota: attachments::quota::QuotaConfig {
            uploads_per_minute: 10_000,
            uploads_burst: 10_000,
            max_pending: MAX_PENDING,
            max_files: MAX_FILES,
            max_bytes: MAX_BYTES,
        },
        ..Default::default()
    })
    .await
    .unwrap();
    let base = platform.urls.attachments.as_str();
    let http = &platform.http;
    // Three owners, each meeting one limit first: `pending` asks for 1-byte forms (3 pending
    // before 5 files or 100 bytes), `bytes` for 40-byte forms (2 fit in 100 bytes), and
    // `files` uploads 2-byte files through the service (verified at once, so never pending:
    // 5 files before 100 bytes).
    let (pending, bytes, files) = (
        platform.infra.token("pending"),
        platform.infra.token("bytes"),
        platform.infra.token("files"),
    );
    let uploads = futures::future::join_all((0..AT_ONCE).map(|n| {
        let (name, bytes) = (format!("f{n}.txt"), format!("{n:02}").into_bytes());
        server_upload(http, base, &files, name, bytes)
    }));
    let (pending_answers, byte_answers, file_answers) = tokio::join!(
        upload_urls(http, base, &pending, "p", 1),
        upload_urls(http, base, &bytes, "b", 40),
        uploads
    );

    let db = sqlx::PgPool::connect(platform.attachments_db.expose_secret())
        .await
        .unwrap();
    // The live files (pending or verified) whose names start with `prefix`: their count and
    // bytes, and how many are pending.
    let held = |prefix: &'static str| {
        sqlx::query_as::<_, (i64, i64, i64)>(
            "SELECT count(*), coalesce(sum(size_bytes), 0)::bigint,
                    count(*) FILTER (WHERE status = 'pending')
             FROM attachments.files
             WHERE file_name LIKE $1 || '%' AND status IN ('pending', 'verified')",
        )
        .bind(prefix)
        .fetch_one(&db)
    };

    // Unfinished uploads: exactly the limit was granted, the rest told to wait.
    let seen = tally(&pending_answers);
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        [200, 429],
        "{seen:?}"
    );
    assert_eq!(
        seen[&200].0, MAX_PENDING as usize,
        "forms granted: {seen:?}"
    );
    assert_eq!(seen[&429].1["code"], "rate_limited", "{seen:?}");
    let (count, _, waiting) = held("p").await.unwrap();
    assert_eq!((count, waiting), (MAX_PENDING, MAX_PENDING), "pending rows");

    // Bytes: two 40-byte files fit in 100, a third would not.
    let seen = tally(&byte_answers);
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        [200, 403],
        "{seen:?}"
    );
    assert_eq!(seen[&200].0, 2, "forms granted: {seen:?}");
    assert_eq!(seen[&403].1["code"], "quota_exceeded", "{seen:?}");
    let (count, held_bytes, _) = held("b").await.unwrap();
    assert_eq!(
        (count, held_bytes),
        (2, 80),
        "rows of the byte-limited owner"
    );
    assert!(held_bytes <= MAX_BYTES);

    // Files, through the service: exactly the limit stored, the others refused and their
    // objects removed again.
    let seen = tally(&file_answers);
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        [200, 403],
        "{seen:?}"
    );
    assert_eq!(seen[&200].0, MAX_FILES as usize, "files stored: {seen:?}");
    assert_eq!(seen[&403].1["code"], "quota_exceeded", "{seen:?}");
    let (count, _, waiting) = held("f").await.unwrap();
    assert_eq!((count, waiting), (MAX_FILES, 0), "verified rows");
    let s3 = platform::s3::client(&platform.s3);
    let listed = s3
        .list_objects_v2()
        .bucket(&platform.s3.bucket)
        .send()
        .await
        .unwrap();
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(
        keys.len(),
        MAX_FILES as usize,
        "only the stored files' objects are in S3: {keys:?}"
    );
}

/// The folder `scripts/infra.sh` runs s3s-fs on (`$SB_DATA_DIR/s3`, `.data/s3` by default).
fn s3s_fs_root() -> PathBuf {
    std::env::var_os("SB_DATA_DIR")
        .map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.data"),
            PathBuf::from,
        )
        .join("s3")
}

/// The multipart uploads open in `s3`'s bucket, by key. S3 answers `ListMultipartUploads`; s3s-fs
/// does not implement it (`NotImplemented`), but keeps one
/// `.bucket-<bucket>.object-<key>.upload-<id>.metadata.json` file (names in unpadded URL-safe
/// base64) in its root folder for each upload from its creation until it is aborted or
/// completed, which is read instead.
async fn open_uploads(s3: &platform::s3::S3Config) -> Vec<String> {
    let bucket = s3.bucket.as_str();
    let listed = platform::s3::client(s3)
        .list_multipart_uploads()
        .bucket(bucket)
        .send()
        .await;
    match listed {
        Ok(listed) => {
            return listed
                .uploads()
                .iter()
                .filter_map(|u| u.key().map(str::to_owned))
                .collect();
        }
        Err(err) => {
            let status = err.raw_response().map(|r| r.status().as_u16());
            let code = err.as_service_error().and_then(|e| e.meta().code());
            assert!(
                status == Some(501) || code == Some("NotImplemented"),
                "ListMultipartUploads failed: {err:?}"
            );
        }
    }
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let prefix = format!(".bucket-{}.object-", b64(bucket));
    let root = s3s_fs_root();
    let entries = std::fs::read_dir(&root).unwrap_or_else(|err| {
        panic!(
            "the S3 server has no ListMultipartUploads and s3s-fs's folder {} cannot be read: {err}",
            root.display()
        )
    });
    entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| {
            let rest = name.strip_prefix(&prefix)?;
            let (key, upload) = rest.split_once(".upload-")?;
            upload.ends_with(".metadata.json").then(|| {
                let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(key)
                    .unwrap_or_default();
                String::from_utf8_lossy(&key).into_owned()
            })
        })
        .collect()
}

/// Polls `open_uploads` until `done` holds of its answer, failing after [`EVENTUAL`].
async fn wait_for_uploads(
    s3: &platform::s3::S3Config,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let open = open_uploads(s3).await;
        if done(&open) {
            return open;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still {open:?} after {EVENTUAL:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_server_upload_cut_by_its_client_mid_way_leaves_no_multipart_upload_in_s3() {
    let platform = TestPlatform::spawn().await.unwrap();
    let alice = platform.infra.token("alice");
    assert_eq!(open_uploads(&platform.s3).await, Vec::<String>::new());

    // A 50 MiB text file announced, of which 9 MiB are sent: more than one 8 MiB part, so the
    // service has started a multipart upload and sent it a part.
    let addr = platform.urls.attachments.trim_start_matches("http://");
    let mut connection = tokio::net::TcpStream::connect(addr).await.unwrap();
    let part_head = "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"cut.txt\"\r\n\
                     Content-Type: text/plain\r\n\r\n";
    let announced = part_head.len() + 50 * MIB + "\r\n--B--\r\n".len();
    let head = format!(
        "POST /api/v1/agent/attachments HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {alice}\r\n\
         Content-Type: multipart/form-data; boundary=B\r\nContent-Length: {announced}\r\n\r\n{part_head}"
    );
    connection.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    for _ in 0..(9 * MIB / chunk.len()) {
        connection.write_all(&chunk).await.unwrap();
    }
    connection.flush().await.unwrap();
    let open = wait_for_uploads(&platform.s3, "the upload never started", |open| {
        !open.is_empty()
    })
    .await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert!(open[0].ends_with("/cut.txt"), "{open:?}");

    // The client goes away mid-file.
    drop(connection);
    wait_for_uploads(
        &platform.s3,
        "the cut upload was never aborted",
        <[String]>::is_empty,
    )
    .await;
    let db = sqlx::PgPool::connect(platform.attachments_db.expose_secret())
        .await
        .unwrap();
    let files: i64 = sqlx::query_scalar("SELECT count(*) FROM attachments.files")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(files, 0, "nothing recorded for the cut upload");
    let listed = platform::s3::client(&platform.s3)
        .list_objects_v2()
        .bucket(&platform.s3.bucket)
        .send()
        .await
        .unwrap();
    assert!(listed.contents().is_empty(), "no object stored: {listed:?}");
}
