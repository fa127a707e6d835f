//! Thread retention (issue 28): a thread whose last message is older than the deployment's time
//! to live, or than its owner's shorter one, is erased by history's sweep like a deleted thread;
//! a younger one stays. Threads are aged by moving their last activity back in the database.

use std::time::Duration;

use secrecy::ExposeSecret as _;
use switchboard_system_tests::{EVENTUAL, Options, TestPlatform, text_run};

#[tokio::test]
async fn threads_past_their_time_to_live_are_erased_and_younger_ones_stay() {
    let platform = TestPlatform::spawn_with(Options {
        thread_ttl: history::ThreadTtl::new(30, Some(r#"{"carol": 1}"#)).unwrap(),
        history_runs_sweep: Duration::from_secs(1),
        ..Default::default()
    })
    .await
    .unwrap();
    let api = platform.api();
    let db = sqlx::PgPool::connect(platform.history_db.expose_secret())
        .await
        .unwrap();
    // (owner, days idle, erased?)
    let cases = [
        ("alice", 40, true),
        ("alice", 2, false),
        ("carol", 2, true),
        ("dave", 2, false),
    ];
    let mut threads = Vec::new();
    for (i, (owner, days, _)) in cases.iter().enumerate() {
        let token = platform.infra.token(owner);
        let thread = uuid::Uuid::new_v4().to_string();
        let events = api
            .stream_run(&token, &text_run(&thread, &format!("r{i}"), "hello"))
            .await
            .unwrap();
        assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
        api.wait_for_status(&token, &format!("r{i}"), "completed")
            .await
            .unwrap();
        sqlx::query(
            "UPDATE history.threads SET updated_at = now() - make_interval(days => $3)
             WHERE owner = $1 AND thread_id = $2",
        )
        .bind(owner)
        .bind(&thread)
        .bind(days)
        .execute(&db)
        .await
        .unwrap();
        threads.push(thread);
    }

    let remaining = |owner: &'static str, thread: String| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM history.messages WHERE owner = $1 AND thread_id = $2",
            )
            .bind(owner)
            .bind(thread)
            .fetch_one(&db)
            .await
            .unwrap()
        }
    };
    let deadline = tokio::time::Instant::now() + EVENTUAL;
    loop {
        let mut erased = Vec::new();
        for ((owner, _, _), thread) in cases.iter().zip(&threads) {
            erased.push(remaining(owner, thread.clone()).await == 0);
        }
        let expected: Vec<bool> = cases.iter().map(|(_, _, gone)| *gone).collect();
        if erased == expected {
            break;
        }
        assert!(
            erased.iter().zip(&expected).all(|(e, x)| !*e || *x),
            "a thread inside its time to live was erased: {erased:?}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old threads were not erased: {erased:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Erased like a deleted thread: its run is gone too.
    let (status, _) = api
        .get_runs(&platform.infra.token("alice"), "/api/v1/agent/runs/r0")
        .await
        .unwrap();
    assert_eq!(status, 404);
    let (status, _) = api
        .get_runs(&platform.infra.token("alice"), "/api/v1/agent/runs/r1")
        .await
        .unwrap();
    assert_eq!(status, 200);
}
