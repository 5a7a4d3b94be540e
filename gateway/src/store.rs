//! The gateway's durable state: sandbox records in SQLite through sqlx.
//!
//! Each row keeps the whole `Sandbox` message (prost-encoded) next to the
//! columns we query by, so the record a client sees is exactly what was
//! stored. Supervisor credentials are kept only as SHA-256 hashes.
//! Migrations are plain SQL statements applied in order and recorded in
//! `schema_migrations`, so a new backend only needs its own SQL text.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use openshell_proto::Sandbox;
use prost::Message;
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

/// Schema versions, applied in order, each exactly once.
const MIGRATIONS: &[(i64, &str)] = &[(
    1,
    "CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        resource_version INTEGER NOT NULL,
        record BLOB NOT NULL,
        token_hash TEXT NOT NULL,
        supervisor_pid INTEGER,
        created_ms INTEGER NOT NULL
    );
    CREATE INDEX sandboxes_token_hash ON sandboxes (token_hash);",
)];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("already exists")]
    AlreadyExists,
    #[error("not found")]
    NotFound,
    #[error("store: {0}")]
    Db(#[from] sqlx::Error),
    #[error("store: corrupt record: {0}")]
    Corrupt(#[from] prost::DecodeError),
}

/// A stored sandbox with the driver's bookkeeping.
#[derive(Debug, Clone)]
pub struct StoredSandbox {
    pub sandbox: Sandbox,
    pub supervisor_pid: Option<i32>,
}

#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
}

impl Store {
    /// Opens (creating if needed) `<data_dir>/gateway.db` and migrates it.
    pub async fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join("gateway.db");
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        let store = Self { pool };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::query("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)")
            .execute(&self.pool)
            .await?;
        for (version, sql) in MIGRATIONS {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let done = sqlx::query("SELECT 1 FROM schema_migrations WHERE version = ?")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await?;
            if done.is_some() {
                continue;
            }
            for statement in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
                sqlx::query(statement).execute(&mut *tx).await?;
            }
            sqlx::query("INSERT INTO schema_migrations (version) VALUES (?)")
                .bind(version)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Ok(())
    }

    pub async fn insert(&self, sandbox: &Sandbox, token_hash: &str) -> Result<(), StoreError> {
        let meta = sandbox.metadata.as_ref().expect("metadata");
        let created_ms = meta
            .created_time
            .as_ref()
            .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
            .unwrap_or_default();
        let result = sqlx::query(
            "INSERT INTO sandboxes (id, name, resource_version, record, token_hash, created_ms)
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(&meta.id)
        .bind(&meta.name)
        .bind(meta.resource_version as i64)
        .bind(sandbox.encode_to_vec())
        .bind(token_hash)
        .bind(created_ms)
        .execute(&self.pool)
        .await;
        match result {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(StoreError::AlreadyExists)
            }
            Err(e) => Err(e.into()),
        }
    }

    pub async fn get_by_name(&self, name: &str) -> Result<StoredSandbox, StoreError> {
        let row = sqlx::query("SELECT record, supervisor_pid FROM sandboxes WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        decode_row(&row)
    }

    pub async fn get_by_id(&self, id: &str) -> Result<StoredSandbox, StoreError> {
        let row = sqlx::query("SELECT record, supervisor_pid FROM sandboxes WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
        decode_row(&row)
    }

    /// The sandbox id a supervisor token hash belongs to.
    pub async fn sandbox_for_token(&self, token_hash: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT id FROM sandboxes WHERE token_hash = ?")
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.get::<String, _>(0)))
    }

    /// Sandboxes ordered by name, starting after `after`.
    pub async fn list_after(
        &self,
        after: &str,
        limit: i64,
    ) -> Result<Vec<StoredSandbox>, StoreError> {
        let rows = sqlx::query(
            "SELECT record, supervisor_pid FROM sandboxes WHERE name > ? ORDER BY name LIMIT ?",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(decode_row).collect()
    }

    pub async fn all(&self) -> Result<Vec<StoredSandbox>, StoreError> {
        self.list_after("", i64::MAX).await
    }

    /// Reads, changes and writes one sandbox record in a transaction, bumping
    /// its resource version. Returns the new record.
    pub async fn update<F>(&self, id: &str, change: F) -> Result<Sandbox, StoreError>
    where
        F: FnOnce(&mut Sandbox),
    {
        // IMMEDIATE takes the write lock up front: two deferred read-then-write
        // transactions would otherwise fail with "database is locked".
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let row = sqlx::query("SELECT record FROM sandboxes WHERE id = ?")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut sandbox = Sandbox::decode(row.get::<Vec<u8>, _>(0).as_slice())?;
        change(&mut sandbox);
        let meta = sandbox.metadata.get_or_insert_with(Default::default);
        meta.resource_version += 1;
        let version = meta.resource_version as i64;
        sqlx::query("UPDATE sandboxes SET record = ?, resource_version = ? WHERE id = ?")
            .bind(sandbox.encode_to_vec())
            .bind(version)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(sandbox)
    }

    pub async fn set_supervisor(
        &self,
        id: &str,
        pid: Option<i32>,
        token_hash: Option<&str>,
    ) -> Result<(), StoreError> {
        let query = match token_hash {
            Some(hash) => {
                sqlx::query("UPDATE sandboxes SET supervisor_pid = ?, token_hash = ? WHERE id = ?")
                    .bind(pid)
                    .bind(hash)
                    .bind(id)
            }
            None => sqlx::query("UPDATE sandboxes SET supervisor_pid = ? WHERE id = ?")
                .bind(pid)
                .bind(id),
        };
        query.execute(&self.pool).await?;
        Ok(())
    }

    pub async fn delete(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sandboxes WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn decode_row(row: &sqlx::sqlite::SqliteRow) -> Result<StoredSandbox, StoreError> {
    let record: Vec<u8> = row.get(0);
    Ok(StoredSandbox {
        sandbox: Sandbox::decode(record.as_slice())?,
        supervisor_pid: row.get::<Option<i32>, _>(1),
    })
}
