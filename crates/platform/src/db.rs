//! PostgreSQL: one schema per service, migrated at start or by the binary's `migrate`
//! subcommand (a Kubernetes Job before the rollout), always tolerant of a newer schema.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use secrecy::{ExposeSecret, SecretString};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

use crate::http::Probe;

/// Connects to `url` with `schema` first on the search path and creates the schema if needed.
/// With `apply`, applies the migrations of `migrator` this binary lacks (whose bookkeeping table
/// then lives in that schema too); without, only checks that every one of them is applied. A
/// migration the database has and this binary does not know (a newer release's, after a
/// rollback) is tolerated either way: migrations are additive (docs/deploying.md).
pub async fn connect(
    url: &SecretString,
    schema: &'static str,
    migrator: &Migrator,
    max_connections: u32,
    apply: bool,
) -> anyhow::Result<PgPool> {
    anyhow::ensure!(
        !schema.is_empty() && schema.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
        "schema name {schema:?} must be lowercase letters and underscores"
    );
    let options = PgConnectOptions::from_str(url.expose_secret())
        .context("the database URL is not a valid PostgreSQL URL")?;
    let mut admin = sqlx::PgConnection::connect_with(&options)
        .await
        .context("cannot connect to PostgreSQL")?;
    // Identifiers cannot be bound; `schema` is a checked compile-time constant.
    let create = format!("CREATE SCHEMA IF NOT EXISTS {schema}");
    if let Err(err) = sqlx::query(&create).execute(&mut admin).await {
        // Two replicas starting together may race on CREATE SCHEMA; the loser sees 23505.
        let raced = err
            .as_database_error()
            .and_then(|e| e.code())
            .is_some_and(|c| c == "23505" || c == "42P06");
        if !raced {
            return Err(err).context("cannot create the service schema");
        }
    }
    admin.close().await.ok();
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options.options([("search_path", schema)]))
        .await
        .context("cannot open the PostgreSQL pool")?;
    if apply {
        tolerant(migrator)
            .run(&pool)
            .await
            .context("cannot apply database migrations")?;
    } else {
        let missing = missing_migrations(&pool, migrator).await?;
        anyhow::ensure!(
            missing.is_empty(),
            "the {schema} schema lacks migrations {missing:?}: run this binary's `migrate` \
             subcommand first (or start it with SB_DB_MIGRATE=true)"
        );
    }
    Ok(pool)
}

/// The `migrate` subcommand: applies `migrator` to `schema` and closes the connection.
pub async fn migrate(
    url: &SecretString,
    schema: &'static str,
    migrator: &Migrator,
) -> anyhow::Result<()> {
    let pool = connect(url, schema, migrator, 1, true).await?;
    pool.close().await;
    tracing::info!(schema, "migrations applied");
    Ok(())
}

/// `migrator`, ignoring applied migrations it does not know.
fn tolerant(migrator: &Migrator) -> Migrator {
    Migrator {
        migrations: migrator.migrations.clone(),
        ignore_missing: true,
        locking: true,
        no_tx: migrator.no_tx,
    }
}

/// Versions of `migrator` the database has not applied (all of them before the first).
async fn missing_migrations(pool: &PgPool, migrator: &Migrator) -> anyhow::Result<Vec<i64>> {
    let applied: Vec<i64> =
        match sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await
        {
            Ok(applied) => applied,
            // 42P01: no bookkeeping table yet, nothing applied.
            Err(err)
                if err
                    .as_database_error()
                    .and_then(|e| e.code())
                    .is_some_and(|c| c == "42P01") =>
            {
                Vec::new()
            }
            Err(err) => return Err(err).context("cannot read the applied migrations"),
        };
    Ok(migrator
        .iter()
        .filter(|m| m.migration_type.is_up_migration() && !applied.contains(&m.version))
        .map(|m| m.version)
        .collect())
}

/// Readiness probe: a trivial query succeeds.
pub fn probe(pool: PgPool) -> Probe {
    std::sync::Arc::new(move || {
        let pool = pool.clone();
        Box::pin(async move {
            sqlx::query("SELECT 1")
                .execute(&pool)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    })
}
