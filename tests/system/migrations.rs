//! The `migrate` subcommand and schema checks of the binaries: what a Kubernetes migrate Job
//! and a rollback rely on.

use std::time::Duration;

use secrecy::ExposeSecret as _;
use switchboard_system_tests::{binary_env, free_port, run_binary};
use test_support::Infra;

/// The environment of `service` on `database`, listening on `port`.
fn service_env(
    infra: &Infra,
    prefix: &str,
    service: &str,
    database: &str,
    port: u16,
) -> Vec<(String, String)> {
    let mut env = binary_env(infra, &infra.nats_url, prefix, &infra.fresh_s3(), database);
    env.push((
        format!("SB_{}_ADDR", service.to_uppercase()),
        format!("127.0.0.1:{port}"),
    ));
    env
}

async fn run(service: &str, args: &[&str], env: &[(String, String)]) -> std::process::Output {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    tokio::time::timeout(Duration::from_secs(60), run_binary(service, args, &env))
        .await
        .expect("the binary finished in time")
        .unwrap()
}

#[tokio::test]
async fn migrate_applies_the_schema_a_checking_start_needs_and_a_newer_schema_is_tolerated() {
    let infra = Infra::from_env();
    for service in ["history", "attachments"] {
        let database = infra.fresh_database().await.unwrap();
        let url = database.expose_secret().to_owned();
        let names = infra.fresh_nats().names;
        let prefix = names.prefix().to_owned();
        let mut env = service_env(&infra, &prefix, service, &url, free_port().unwrap());
        env.push(("SB_DB_MIGRATE".into(), "false".into()));

        // A release started before its migrate Job ran refuses to serve, naming the fix.
        let refused = run(service, &[], &env).await;
        let stderr = String::from_utf8_lossy(&refused.stdout).to_string()
            + &String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success(),
            "{service} started on an empty schema"
        );
        assert!(
            stderr.contains("lacks migrations") && stderr.contains("migrate"),
            "{service}: {stderr}"
        );

        // The Job: applies everything, exits 0; a second run is a no-op.
        for _ in 0..2 {
            let migrated = run(service, &["migrate"], &env).await;
            assert!(
                migrated.status.success(),
                "{service} migrate failed: {}",
                String::from_utf8_lossy(&migrated.stderr)
            );
        }
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let applied: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {service}._sqlx_migrations WHERE success"
        ))
        .fetch_one(&pool)
        .await
        .unwrap();
        let known = std::fs::read_dir(
            switchboard_system_tests::gateway::workspace_root()
                .join(format!("migrations/{service}")),
        )
        .unwrap()
        .count();
        assert_eq!(
            applied,
            i64::try_from(known).unwrap(),
            "{service}: every migration applied"
        );

        // A newer release's migration (a rollback): both modes still check and start.
        sqlx::query(&format!(
            "INSERT INTO {service}._sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (99990101000000, 'from a newer release', true, '\\x00', 0)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        for migrate in ["false", "true"] {
            let port = free_port().unwrap();
            let mut env = service_env(&infra, &prefix, service, &url, port);
            env.push(("SB_DB_MIGRATE".into(), migrate.into()));
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let binary = run_binary_ready(service, &env, port).await;
            assert!(
                binary,
                "{service} (SB_DB_MIGRATE={migrate}) did not start on a newer schema"
            );
        }
        let unknown = run(
            service,
            &["frobnicate"],
            &service_env(&infra, &prefix, service, &url, 0),
        )
        .await;
        assert!(
            !unknown.status.success(),
            "an unknown subcommand is refused"
        );
        test_support::remove_nats_prefix(&infra.nats_url, &names)
            .await
            .unwrap();
    }
}

/// Starts `service` and answers whether it became ready (then stops it).
async fn run_binary_ready(service: &str, env: &[(&str, &str)], port: u16) -> bool {
    let mut child = switchboard_system_tests::spawn_binary(service, env).unwrap();
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut ready = false;
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if let Ok(response) = http
            .get(format!("http://127.0.0.1:{port}/readyz"))
            .send()
            .await
            && response.status().is_success()
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill().await;
    ready
}
