//! Erasure (issue 28): `DELETE /api/v1/agent/threads/{threadId}` and `DELETE /api/v1/agent/me`
//! leave nothing of what they erase in any store. Each test lists the stores and looks in each:
//! history's and attachments' tables in PostgreSQL, the objects in S3, and every message of every
//! stream and bucket of the platform's NATS prefix (RUNS, RUN_EVENTS and every KV bucket).

use std::collections::HashSet;

use futures::StreamExt as _;
use secrecy::ExposeSecret as _;
use serde_json::Value;
use switchboard_system_tests::{EVENTUAL, TestPlatform, text_run, upload_file};

/// Every message kept in the streams and buckets of the platform's prefix: (stream, subject,
/// payload). Purge markers (no payload) are kept apart by the callers.
async fn every_message(platform: &TestPlatform) -> Vec<(String, String, Vec<u8>)> {
    let js =
        async_nats::jetstream::new(async_nats::connect(&platform.infra.nats_url).await.unwrap());
    let prefix = platform
        .nats
        .names
        .prefix()
        .to_ascii_uppercase()
        .replace('-', "_");
    let names: Vec<String> = js
        .stream_names()
        .filter_map(|name| async move { name.ok() })
        .filter(|name| {
            let name = name.clone();
            let prefix = prefix.clone();
            async move {
                name.starts_with(&format!("{prefix}_"))
                    || name.starts_with(&format!("KV_{prefix}_"))
            }
        })
        .collect()
        .await;
    assert!(
        names.len() >= 4,
        "the platform's streams and buckets: {names:?}"
    );
    let mut messages = Vec::new();
    for name in names {
        let stream = js.get_stream(&name).await.unwrap();
        let state = stream.cached_info().state.clone();
        if state.messages == 0 {
            continue;
        }
        for seq in state.first_sequence..=state.last_sequence {
            if let Ok(message) = stream.get_raw_message(seq).await {
                messages.push((
                    name.clone(),
                    message.subject.to_string(),
                    message.payload.to_vec(),
                ));
            }
        }
    }
    messages
}

/// The messages with a payload (not purge markers) whose subject or payload holds one of
/// `needles`.
fn holding<'a>(
    messages: &'a [(String, String, Vec<u8>)],
    needles: &[String],
) -> Vec<&'a (String, String, Vec<u8>)> {
    messages
        .iter()
        .filter(|(_, subject, payload)| {
            !payload.is_empty()
                && needles.iter().any(|needle| {
                    subject.contains(needle.as_str())
                        || String::from_utf8_lossy(payload).contains(needle.as_str())
                })
        })
        .collect()
}

fn describe(found: &[&(String, String, Vec<u8>)]) -> String {
    found
        .iter()
        .map(|(stream, subject, payload)| {
            format!(
                "{stream} {subject}: {}",
                String::from_utf8_lossy(&payload[..payload.len().min(200)])
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Counts rows of `sql` (one `$1` text parameter) in a database.
async fn count(url: &secrecy::SecretString, sql: &str, param: &str) -> i64 {
    let pool = sqlx::PgPool::connect(url.expose_secret()).await.unwrap();
    let n: i64 = sqlx::query_scalar(sql)
        .bind(param)
        .fetch_one(&pool)
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"));
    pool.close().await;
    n
}

/// The object keys in the platform's bucket.
async fn object_keys(platform: &TestPlatform) -> HashSet<String> {
    let s3 = platform::s3::client(&platform.s3);
    let listed = s3
        .list_objects_v2()
        .bucket(&platform.s3.bucket)
        .send()
        .await
        .unwrap();
    listed
        .contents()
        .iter()
        .filter_map(|object| object.key().map(str::to_owned))
        .collect()
}

/// The object key of an `s3://bucket/key` URL.
fn key_of(url: &str) -> String {
    url.trim_start_matches("s3://")
        .split_once('/')
        .map(|(_, key)| key.to_owned())
        .unwrap_or_default()
}

async fn delete(platform: &TestPlatform, token: &str, path: &str) -> (u16, Value) {
    let response = platform
        .http
        .delete(format!("{}{path}", platform.urls.runs))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The task id of the owner's run `run_id`.
async fn task_of(platform: &TestPlatform, token: &str, run_id: &str) -> String {
    let (status, body) = platform
        .api()
        .get_runs(token, &format!("/api/v1/agent/runs/{run_id}"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{run_id}: {body}");
    body["taskId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn erasing_a_thread_cancels_its_run_ends_its_stream_and_leaves_nothing_of_it_in_any_store() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let bob = platform.infra.token("bob");
    let doomed = uuid::Uuid::new_v4().to_string();
    let kept = uuid::Uuid::new_v4().to_string();
    let bobs = uuid::Uuid::new_v4().to_string();

    // Files: one only in the doomed thread, one in both of alice's threads (the same bytes,
    // one file), one of bob's.
    let only_here = upload_file(
        &platform,
        &alice,
        &doomed,
        b"only in the doomed thread".to_vec(),
        "only.txt",
        "text/plain",
    )
    .await;
    let shared = upload_file(
        &platform,
        &alice,
        &doomed,
        b"in both threads".to_vec(),
        "shared.txt",
        "text/plain",
    )
    .await;
    let shared_again = upload_file(
        &platform,
        &alice,
        &kept,
        b"in both threads".to_vec(),
        "shared.txt",
        "text/plain",
    )
    .await;
    assert_eq!(shared, shared_again, "one file, in two threads");
    let bobs_file = upload_file(
        &platform,
        &bob,
        &bobs,
        b"bob's".to_vec(),
        "bob.txt",
        "text/plain",
    )
    .await;

    // The doomed thread: a finished run, a prompt left waiting, a stream following it, a run
    // in flight. Alice's other thread and bob's have a run each.
    let done = api
        .stream_run(&alice, &text_run(&doomed, "d-done", "hello doomed world"))
        .await
        .unwrap();
    assert_eq!(done.last().unwrap()["type"], "RUN_FINISHED");
    let (status, _) = api
        .post_run(
            &alice,
            &text_run(&doomed, "d-asks", "/ask text:120 Why so?"),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_status(&alice, "d-asks", "completed")
        .await
        .unwrap();
    for (token, thread, run) in [(&alice, &kept, "k-done"), (&bob, &bobs, "b-done")] {
        let events = api
            .stream_run(token, &text_run(thread, run, "hello kept world"))
            .await
            .unwrap();
        assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    }
    let follower = platform
        .http
        .get(format!(
            "{}/api/v1/agent/threads/{doomed}/events",
            platform.urls.runs
        ))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(follower.status().as_u16(), 200);
    let follower = tokio::spawn(async move {
        let mut body = follower.bytes_stream();
        while let Some(chunk) = body.next().await {
            if chunk.is_err() {
                break;
            }
        }
    });
    let words: Vec<String> = (0..300).map(|i| format!("w{i}")).collect();
    let (status, _) = api
        .post_run(
            &alice,
            &text_run(&doomed, "d-slow", &format!("/slow {}", words.join(" "))),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_status(&alice, "d-slow", "running")
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for run in ["d-done", "d-asks", "d-slow"] {
        tasks.push(task_of(&platform, &alice, run).await);
    }
    let before = every_message(&platform).await;
    assert!(
        !holding(&before, std::slice::from_ref(&doomed)).is_empty(),
        "the streams held the thread before"
    );

    // Bob cannot erase alice's thread: not found, and nothing goes.
    let (status, body) = delete(&platform, &bob, &format!("/api/v1/agent/threads/{doomed}")).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");

    let (status, body) = delete(
        &platform,
        &alice,
        &format!("/api/v1/agent/threads/{doomed}"),
    )
    .await;
    assert_eq!(status, 204, "{body}");

    // The stream that followed it has ended.
    tokio::time::timeout(EVENTUAL, follower)
        .await
        .expect("the erased thread's stream ended")
        .unwrap();

    // PostgreSQL: history keeps nothing of the thread (the tombstones hold task ids only).
    let history = &platform.history_db;
    for table in ["threads", "messages", "run_progress"] {
        let sql = format!("SELECT count(*) FROM history.{table} WHERE thread_id = $1");
        assert_eq!(count(history, &sql, &doomed).await, 0, "history.{table}");
    }
    let task_list = format!("{{{}}}", tasks.join(","));
    for table in ["tool_calls", "run_usage"] {
        let sql =
            format!("SELECT count(*) FROM history.{table} WHERE task_id = ANY($1::text::uuid[])");
        assert_eq!(count(history, &sql, &task_list).await, 0, "history.{table}");
    }
    for thread in [&kept, &bobs] {
        let sql = "SELECT count(*) FROM history.messages WHERE thread_id = $1";
        assert_eq!(
            count(history, sql, thread).await,
            2,
            "the other threads stay"
        );
    }
    // Attachments: the thread's links and the file only it had are gone; the shared file stays.
    let files = &platform.attachments_db;
    let sql = "SELECT count(*) FROM attachments.workspace_files WHERE session_id = $1";
    assert_eq!(count(files, sql, &doomed).await, 0);
    assert_eq!(count(files, sql, &kept).await, 1);
    let sql = "SELECT count(*) FROM attachments.files WHERE object_key = $1";
    assert_eq!(count(files, sql, &key_of(&only_here)).await, 0);
    assert_eq!(count(files, sql, &key_of(&shared)).await, 1);
    // S3: likewise.
    let objects = object_keys(&platform).await;
    assert!(!objects.contains(&key_of(&only_here)), "{objects:?}");
    assert!(objects.contains(&key_of(&shared)), "{objects:?}");
    assert!(objects.contains(&key_of(&bobs_file)), "{objects:?}");
    // NATS: no task, event, status, prompt, lock or state of the thread is left in any stream or
    // bucket (by the thread id, the task ids, or a key derived from the thread).
    let after = every_message(&platform).await;
    let mut needles = vec![doomed.clone()];
    needles.extend(tasks.iter().cloned());
    needles.push(protocol::messaging::thread_lock_key("alice", &doomed));
    needles.push(protocol::messaging::thread_state_key("alice", &doomed));
    needles.push(protocol::interaction::thread_prompt_key("alice", &doomed));
    let left = holding(&after, &needles);
    assert!(left.is_empty(), "left behind:\n{}", describe(&left));
    assert!(
        !holding(&after, &[kept.clone(), bobs.clone()]).is_empty(),
        "the other threads' runs stay"
    );

    // The APIs agree: no thread, no runs, no search hit; a second erase is a 404.
    let (status, _) = api
        .get_runs(&alice, "/api/v1/agent/runs/d-done")
        .await
        .unwrap();
    assert_eq!(status, 404);
    let listed: Value = platform
        .http
        .get(format!("{}/api/v1/agent/threads", platform.urls.history))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = listed["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["threadId"].as_str())
        .collect();
    assert_eq!(ids, [kept.as_str()], "{listed}");
    let (status, body) = delete(
        &platform,
        &alice,
        &format!("/api/v1/agent/threads/{doomed}"),
    )
    .await;
    assert_eq!(status, 404, "{body}");

    // The thread id can start a new conversation.
    let again = api
        .stream_run(&alice, &text_run(&doomed, "d-new", "a fresh start"))
        .await
        .unwrap();
    assert_eq!(again.last().unwrap()["type"], "RUN_FINISHED");
}

#[tokio::test]
async fn erasing_an_owner_leaves_nothing_of_theirs_and_only_an_admin_may_name_another() {
    let platform = TestPlatform::spawn().await.unwrap();
    let api = platform.api();
    let alice = platform.infra.token("alice");
    let bob = platform.infra.token("bob");
    let admin = platform
        .infra
        .token_with_scope("ops", "openid switchboard:admin");
    let threads: Vec<String> = (0..3).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    for (i, thread) in threads.iter().enumerate() {
        upload_file(
            &platform,
            &alice,
            thread,
            format!("alice's file {i}").into_bytes(),
            "a.txt",
            "text/plain",
        )
        .await;
        let events = api
            .stream_run(&alice, &text_run(thread, &format!("a{i}"), "hello"))
            .await
            .unwrap();
        assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    }
    // A file outside any thread, and a prompt left waiting.
    upload_file(
        &platform,
        &alice,
        "",
        b"loose".to_vec(),
        "l.txt",
        "text/plain",
    )
    .await;
    let (status, _) = api
        .post_run(
            &alice,
            &text_run(&threads[0], "a-asks", "/ask text:120 Why?"),
        )
        .await
        .unwrap();
    assert_eq!(status, 202);
    api.wait_for_status(&alice, "a-asks", "completed")
        .await
        .unwrap();
    let bobs = uuid::Uuid::new_v4().to_string();
    let bobs_file = upload_file(
        &platform,
        &bob,
        &bobs,
        b"bob's".to_vec(),
        "b.txt",
        "text/plain",
    )
    .await;
    api.stream_run(&bob, &text_run(&bobs, "b0", "hello"))
        .await
        .unwrap();

    // Naming another owner needs the admin scope.
    let (status, body) = delete(&platform, &alice, "/api/v1/agent/me?owner=bob").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    assert_eq!(body["error"]["field"], "owner");
    let (status, body) = delete(&platform, &alice, "/api/v1/agent/me?everyone=1").await;
    assert_eq!(status, 400, "{body}");

    let (status, body) = delete(&platform, &alice, "/api/v1/agent/me").await;
    assert_eq!(status, 204, "{body}");

    for (table, column) in [
        ("history.threads", "owner"),
        ("history.messages", "owner"),
        ("history.run_progress", "owner"),
    ] {
        let sql = format!("SELECT count(*) FROM {table} WHERE {column} = $1");
        assert_eq!(
            count(&platform.history_db, &sql, "alice").await,
            0,
            "{table}"
        );
        assert!(
            count(&platform.history_db, &sql, "bob").await > 0,
            "bob's {table} stays"
        );
    }
    for table in ["attachments.files", "attachments.workspace_files"] {
        let sql = format!("SELECT count(*) FROM {table} WHERE owner = $1");
        assert_eq!(
            count(&platform.attachments_db, &sql, "alice").await,
            0,
            "{table}"
        );
    }
    let objects = object_keys(&platform).await;
    assert_eq!(
        objects,
        HashSet::from([key_of(&bobs_file)]),
        "only bob's object is left"
    );
    let after = every_message(&platform).await;
    let digest = protocol::messaging::short_digest("alice");
    let left = holding(&after, &["\"alice\"".to_owned(), digest]);
    assert!(left.is_empty(), "left behind:\n{}", describe(&left));
    assert!(!holding(&after, &["\"bob\"".to_owned()]).is_empty());

    // Idempotent; and an admin erases bob by name.
    let (status, _) = delete(&platform, &alice, "/api/v1/agent/me").await;
    assert_eq!(status, 204);
    let (status, body) = delete(&platform, &admin, "/api/v1/agent/me?owner=bob").await;
    assert_eq!(status, 204, "{body}");
    let sql = "SELECT count(*) FROM history.messages WHERE owner = $1";
    assert_eq!(count(&platform.history_db, sql, "bob").await, 0);
    assert!(object_keys(&platform).await.is_empty());

    // Who am I.
    let me: Value = platform
        .http
        .get(format!("{}/api/v1/agent/me", platform.urls.runs))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(me, serde_json::json!({"sub": "ops", "admin": true}));
}
