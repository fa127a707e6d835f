//! PostgreSQL: one schema per service, migrated at start.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use secrecy::{ExposeSecret, SecretString};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

use crate::http::Probe;

/// Connects to `url` with `schema` first on the search path, creates the schema if needed and
/// applies `migrator` (whose bookkeeping table then lives in that schema too).
pub async fn connect_and_migrate(
    url: &SecretString,
    schema: &'static str,
    migrator: &Migrator,
    max_connections: u32,
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
    migrator
        .run(&pool)
        .await
        .context("cannot apply database migrations")?;
    Ok(pool)
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
