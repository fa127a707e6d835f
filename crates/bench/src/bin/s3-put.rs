//! Baseline for the attachments service's server-side upload: one `PutObject` of a file,
//! streamed from disk, to the same S3 server with the same credentials.
//!
//! Reads the S3 settings the attachments service reads (`SB_S3_ENDPOINT`, `SB_S3_REGION`,
//! `SB_S3_ACCESS_KEY`, `SB_S3_SECRET_KEY`, `SB_S3_BUCKET`; `--bucket` overrides the last),
//! builds the client with `platform::s3::client` (the service's own), makes sure the bucket
//! exists, then sends one `PutObject` whose body is `ByteStream::from_path`: the file is read
//! from disk as it is sent and never held in memory. The SDK's default checksum behaviour is
//! kept, as in the service. Prints one JSON line: bytes, seconds of the `PutObject` (from
//! opening the file to S3's answer), MB/s (10^6 bytes per second), the ETag and the peak RSS of
//! this process.
//!
//! Usage: `s3-put --file PATH [--key KEY] [--bucket B] [--content-type T] [--max-seconds S]
//! [--part-mib N]` (default key `bench/<uuid>/<file name>`, content type `application/pdf`, at
//! most 300 s).
//!
//! With `--part-mib N` the file goes as a multipart upload instead, as the attachments service
//! sends it: `CreateMultipartUpload`, N MiB parts one after the other (each streamed from its
//! range of the file), `CompleteMultipartUpload`; the line then also has the seconds of the
//! complete call alone.
//!
//! `s3-put --mode delete-bucket --bucket B` instead deletes every object and unfinished
//! multipart upload of B, then B itself (what a benchmark left on the shared S3 server), and
//! prints what it deleted.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use platform::config::Env;
use platform::s3::S3Config;
use serde_json::json;
use switchboard_bench::{Args, peak_rss_kib};

/// At most this many objects or uploads are deleted by one `delete-bucket` run.
const MAX_DELETES: usize = 100_000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = switchboard_bench::args!()?;
    let mut config = S3Config::from_env(&Env::from_process())?;
    if let Some(bucket) = args.get("bucket", "BENCH_S3_BUCKET") {
        config.bucket = bucket;
    }
    let s3 = platform::s3::client(&config);
    let max_time =
        Duration::from_secs_f64(args.parsed("max-seconds", "BENCH_MAX_SECONDS", 300.0)?);
    let line = match args
        .get("mode", "BENCH_MODE")
        .unwrap_or_else(|| "put".to_owned())
        .as_str()
    {
        "put" => tokio::time::timeout(max_time, put(&s3, &config.bucket, &args))
            .await
            .context("the put did not finish in --max-seconds")??,
        "delete-bucket" => tokio::time::timeout(max_time, delete_bucket(&s3, &config.bucket))
            .await
            .context("delete-bucket did not finish in --max-seconds")??,
        other => anyhow::bail!("--mode {other:?}: use put or delete-bucket"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

async fn put(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    args: &Args,
) -> anyhow::Result<serde_json::Value> {
    let path = PathBuf::from(
        args.get("file", "BENCH_FILE")
            .context("--file is required (the file to upload)")?,
    );
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("file")
        .to_owned();
    let key = args
        .get("key", "BENCH_KEY")
        .unwrap_or_else(|| format!("bench/{}/{file_name}", uuid::Uuid::new_v4()));
    let content_type = args
        .get("content-type", "BENCH_CONTENT_TYPE")
        .unwrap_or_else(|| "application/pdf".to_owned());
    platform::s3::ensure_bucket(s3, bucket).await?;

    let part_mib: u64 = args.parsed("part-mib", "BENCH_PART_MIB", 0)?;
    let started = Instant::now();
    let (bytes, e_tag, complete_seconds) = if part_mib == 0 {
        let body = ByteStream::from_path(&path)
            .await
            .with_context(|| format!("cannot open {}", path.display()))?;
        let bytes = body.size_hint().0;
        let answer = s3
            .put_object()
            .bucket(bucket)
            .key(&key)
            .content_type(&content_type)
            .body(body)
            .send()
            .await
            .map_err(aws_sdk_s3::Error::from)
            .context("PutObject failed")?;
        (bytes, answer.e_tag().map(str::to_owned), None)
    } else {
        multipart(
            s3,
            bucket,
            &key,
            &content_type,
            &path,
            part_mib * 1024 * 1024,
        )
        .await?
    };
    let seconds = started.elapsed().as_secs_f64();
    Ok(json!({
        "target": "s3-put",
        "mode": if part_mib == 0 { "put-object".to_owned() } else { format!("multipart-{part_mib}MiB") },
        "bucket": bucket,
        "key": key,
        "bytes": bytes,
        "seconds": seconds,
        "complete_seconds": complete_seconds,
        "mb_per_s": bytes as f64 / seconds / 1e6,
        "e_tag": e_tag,
        "peak_rss_kib": peak_rss_kib(),
    }))
}

/// Uploads `path` in `part_bytes` parts, one after the other; returns the size, the ETag and
/// the seconds of `CompleteMultipartUpload`.
async fn multipart(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    content_type: &str,
    path: &std::path::Path,
    part_bytes: u64,
) -> anyhow::Result<(u64, Option<String>, Option<f64>)> {
    let size = tokio::fs::metadata(path)
        .await
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    let created = s3
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .content_type(content_type)
        .send()
        .await
        .map_err(aws_sdk_s3::Error::from)?;
    let upload_id = created.upload_id().unwrap_or_default().to_owned();
    let mut parts = Vec::new();
    let mut offset = 0;
    while offset < size {
        let length = part_bytes.min(size - offset);
        let number = i32::try_from(parts.len() + 1)?;
        let body = ByteStream::read_from()
            .path(path)
            .offset(offset)
            .length(Length::Exact(length))
            .build()
            .await?;
        let uploaded = s3
            .upload_part()
            .bucket(bucket)
            .key(key)
            .upload_id(&upload_id)
            .part_number(number)
            .body(body)
            .send()
            .await
            .map_err(aws_sdk_s3::Error::from)?;
        parts.push(
            CompletedPart::builder()
                .part_number(number)
                .set_e_tag(uploaded.e_tag().map(str::to_owned))
                .build(),
        );
        offset += length;
    }
    let completing = Instant::now();
    let completed = s3
        .complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(&upload_id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await
        .map_err(aws_sdk_s3::Error::from)?;
    Ok((
        size,
        completed.e_tag().map(str::to_owned),
        Some(completing.elapsed().as_secs_f64()),
    ))
}

/// Deletes every object and unfinished multipart upload of `bucket` (where the server lists
/// them), then `bucket`.
async fn delete_bucket(s3: &aws_sdk_s3::Client, bucket: &str) -> anyhow::Result<serde_json::Value> {
    let mut keys = Vec::new();
    let mut pages = s3.list_objects_v2().bucket(bucket).into_paginator().send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(aws_sdk_s3::Error::from)?;
        keys.extend(
            page.contents()
                .iter()
                .filter_map(|o| o.key().map(str::to_owned)),
        );
        anyhow::ensure!(keys.len() <= MAX_DELETES, "more than {MAX_DELETES} objects");
    }
    for key in &keys {
        s3.delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(aws_sdk_s3::Error::from)?;
    }
    // Unfinished multipart uploads; not every S3 server lists them (s3s-fs answers
    // NotImplemented), and then there is nothing to do here.
    let mut aborted = 0_usize;
    let mut multipart_listing = "ok".to_owned();
    match s3.list_multipart_uploads().bucket(bucket).send().await {
        Ok(uploads) => {
            for upload in uploads.uploads().iter().take(MAX_DELETES) {
                if let (Some(key), Some(id)) = (upload.key(), upload.upload_id()) {
                    s3.abort_multipart_upload()
                        .bucket(bucket)
                        .key(key)
                        .upload_id(id)
                        .send()
                        .await
                        .map_err(aws_sdk_s3::Error::from)?;
                    aborted += 1;
                }
            }
        }
        Err(err) => {
            let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&err).unwrap_or("error");
            multipart_listing = format!("not listed ({code})");
        }
    }
    s3.delete_bucket()
        .bucket(bucket)
        .send()
        .await
        .map_err(aws_sdk_s3::Error::from)?;
    Ok(json!({
        "target": "delete-bucket",
        "bucket": bucket,
        "deleted_objects": keys.len(),
        "aborted_uploads": aborted,
        "multipart_listing": multipart_listing,
    }))
}
