//! The gateway's durable state, in SQLite (default, one file shared by the
//! replicas of one host) or PostgreSQL (replicas on several hosts), through
//! sqlx's `Any` driver. Both speak the same SQL here except for a few
//! dialect pieces ([`Dialect`]): the schema types, how a write transaction
//! starts, and the database clock.
//!
//! Every freshness judgement (membership, session ownership) compares
//! timestamps written and read with the **database's** clock, so replicas
//! whose own clocks disagree still agree on who is live.
//!
//! Sandbox rows keep the whole `Sandbox` message (prost-encoded) beside the
//! columns we query by. Every sandbox write appends to `sandbox_events`
//! (`events`: the log behind watch cursors and sandbox logs), which
//! replicas poll to wake their watchers for changes made elsewhere. Supervisor
//! credentials are stored only as SHA-256 hashes.
//!
//! Every call has a deadline ([`StoreOptions::deadline`], 5 s by default):
//! waiting for a pool connection and every statement count against it, and
//! an expired one is [`StoreError::TimedOut`], which the API answers as
//! UNAVAILABLE. A frozen server keeps its TCP connections open, so only a
//! deadline on our side bounds a call; PostgreSQL's own `statement_timeout`
//! is set to the same value for statements that are merely slow. A call cut
//! off mid-statement leaves its connection to the pool's release check
//! (sqlx pings it before reuse and drops it if broken), so the pool
//! recovers by itself once the server answers again.
//!
//! Folder: this module (the sandbox statements, the pool, the deadline),
//! `events` (the event log and its trimming), `schema` (every version's DDL), `hosts`, `members` and
//! `ssh_sessions` (their tables' statements), `failover` (moving sandboxes
//! off lost supervisor hosts), `fault` (the test fault) and
//! `layout` (the data directory). The lowest layer: imports no other module.
//! Each function is one statement (or one transaction) with its dialect
//! differences.

mod events;
mod failover;
mod fault;
mod hosts;
pub mod layout;
mod members;
mod schema;
mod ssh_sessions;

pub use events::{DELETED_TTL, EventKind};
pub use failover::{Placement, Stranded};
pub use fault::StoreFault;
pub use hosts::HostSeat;

/// Whether a hello of `instance_id` with connection `epoch` comes from an
/// attempt older than the session `existing`'s: the same supervisor (or
/// host) instance has since connected again, so this hello is a late
/// arrival of an attempt it gave up. A different instance (a restarted
/// supervisor) always takes over.
pub fn is_stale(existing: (&str, u64), instance_id: &str, epoch: u64) -> bool {
    !instance_id.is_empty() && existing.0 == instance_id && existing.1 > epoch
}

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openshell_proto::Sandbox;
use prost::Message;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, AssertSqlSafe, Row};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// Milliseconds since the epoch by the database's clock.
    fn now_ms(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }

    /// [`Dialect::now_ms`] fixed for the whole statement, so that an index
    /// can be searched by it (PostgreSQL's `statement_timestamp()`; SQLite's
    /// `'now'` already is).
    fn statement_now_ms(self) -> &'static str {
        match self {
            Dialect::Sqlite => Dialect::Sqlite.now_ms(),
            Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000 AS BIGINT)",
        }
    }

    pub(crate) fn lock_row(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("already exists")]
    AlreadyExists,
    /// Pooled placement found no supervisor host with a live session.
    #[error("no supervisor host is connected")]
    NoHost,
    /// Every live supervisor host serves as many sandboxes as it may.
    #[error("every connected supervisor host is full")]
    HostsFull,
    #[error("not found")]
    NotFound,
    /// A live session of the same supervisor host instance came from a
    /// later connection attempt (its epoch).
    #[error("a newer connection (epoch {0}) holds the host's session")]
    Superseded(u64),
    #[error("store: {0}")]
    Db(#[from] sqlx::Error),
    #[error("store: corrupt record: {0}")]
    Corrupt(#[from] prost::DecodeError),
    /// The call's deadline passed (no connection free, or no answer). The
    /// message names the store kind and the deadline, never the URL.
    #[error("the {store} store did not answer within {} s", .after.as_secs_f64())]
    TimedOut {
        store: &'static str,
        after: Duration,
    },
}

/// A stored sandbox with the driver's bookkeeping.
/// A sandbox's policy scope row as the configuration model builds it
/// (config_model.rs): prost-encoded, versioned `SandboxPolicy` and its hash.
#[derive(Debug, Clone)]
pub struct PolicySeed {
    pub version: i64,
    pub encoded: Vec<u8>,
    pub hash: String,
}

#[derive(Debug, Clone)]
pub struct StoredSandbox {
    pub sandbox: Sandbox,
    /// 0: none; -1: a replica is starting one.
    pub supervisor_pid: i64,
    /// Host whose driver runs the supervisor.
    pub driver_host: String,
}

/// A replica of the cluster as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub replica_id: String,
    pub peer_endpoint: String,
}

/// Which replica holds a sandbox's supervisor session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRecord {
    pub sandbox_id: String,
    pub replica_id: String,
    pub peer_endpoint: String,
    pub session_id: String,
    pub instance_id: String,
    pub connection_epoch: i64,
}

/// What the store knows of one SSH session token (by its hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshSessionState {
    pub sandbox_id: String,
    pub revoked: bool,
    /// Past its expiry by the database's clock.
    pub expired: bool,
    /// Time left until the expiry by the database's clock; `None` for a
    /// session that never expires.
    pub expires_in: Option<Duration>,
}

/// Default connections in the store's pool (`--database-max-connections`;
/// config build permits are sized from it).
pub const POOL_SIZE: u32 = 8;
/// Default deadline of one store call (`--database-timeout-ms`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);
/// PostgreSQL ends a session left idle inside a transaction this long (a
/// replica frozen while holding row locks must not block the others).
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(60);
/// Bound of the start-up migration on PostgreSQL (its wait for another
/// replica's migration included), instead of the per-call deadline.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);

/// How the store's pool is sized and how long a call may take.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    pub max_connections: u32,
    pub deadline: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_connections: POOL_SIZE,
            deadline: DEFAULT_DEADLINE,
        }
    }
}

#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
    deadline: Duration,
    fault: Arc<StoreFault>,
    /// Bumped whenever a sandbox token hash is written (see
    /// [`Store::token_writes`]).
    token_writes: Arc<AtomicU64>,
}

/// Bumps the token write counter when dropped: after the write committed,
/// failed or was cut off by its deadline (it may still commit then).
struct TokenWriteGuard<'a>(&'a AtomicU64);

impl Drop for TokenWriteGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

const SANDBOX_COLUMNS: &str = "record, supervisor_pid, driver_host";

impl Store {
    /// Opens `url` (`sqlite://PATH` or `postgres://...`), creating an SQLite
    /// file if needed, and migrates it.
    pub async fn open(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let dialect = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Dialect::Postgres
        } else {
            Dialect::Sqlite
        };
        let url = match dialect {
            Dialect::Sqlite if !url.contains('?') => format!("{url}?mode=rwc"),
            _ => url.to_owned(),
        };
        let deadline = options.deadline;
        let deadline_ms = deadline.as_millis();
        let pool = AnyPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(deadline)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    match dialect {
                        Dialect::Sqlite => {
                            // Several replicas may share the file: wait for
                            // locks (as long as a call may take) instead of
                            // failing, and let readers run beside a writer.
                            let busy = format!("PRAGMA busy_timeout = {deadline_ms}");
                            sqlx::query(AssertSqlSafe(busy)).execute(&mut *conn).await?;
                            sqlx::query("PRAGMA journal_mode = WAL")
                                .execute(&mut *conn)
                                .await?;
                        }
                        Dialect::Postgres => {
                            let idle = IDLE_IN_TRANSACTION.as_millis().max(2 * deadline_ms);
                            for set in [
                                format!("SET statement_timeout = {deadline_ms}"),
                                format!("SET idle_in_transaction_session_timeout = {idle}"),
                            ] {
                                sqlx::query(AssertSqlSafe(set)).execute(&mut *conn).await?;
                            }
                        }
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await?;
        let store = Self {
            pool,
            dialect,
            deadline,
            fault: Arc::default(),
            token_writes: Arc::new(AtomicU64::new(0)),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// The injected fault every call of this store meets (none by default).
    pub fn fault(&self) -> &Arc<StoreFault> {
        &self.fault
    }

    /// The deadline of one call.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// "sqlite" or "postgres", for messages that must not show the URL.
    pub fn kind(&self) -> &'static str {
        match self.dialect {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    /// The error of a call whose deadline passed.
    pub fn timed_out(&self) -> StoreError {
        StoreError::TimedOut {
            store: self.kind(),
            after: self.deadline,
        }
    }

    /// Runs one store call within the deadline. An expired deadline and a
    /// pool that had no connection to give within it are both `TimedOut`.
    pub async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let faulted = async {
            self.fault.meet().await;
            call.await
        };
        match tokio::time::timeout(self.deadline, faulted).await {
            Ok(Err(StoreError::Db(sqlx::Error::PoolTimedOut))) | Err(_) => Err(self.timed_out()),
            Ok(result) => result,
        }
    }

    /// How many sandbox token writes (new sandboxes, new supervisor tokens)
    /// this process has made. A cache of token lookups is stale once it
    /// changes.
    pub fn token_writes(&self) -> u64 {
        self.token_writes.load(Ordering::SeqCst)
    }

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// A read-only transaction that sees one consistent snapshot (SQLite
    /// read transactions always do; PostgreSQL needs REPEATABLE READ).
    pub(crate) async fn begin_read(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
        self.bounded(async {
            Ok(match self.dialect {
                Dialect::Sqlite => self.pool.begin().await?,
                Dialect::Postgres => {
                    self.pool
                        .begin_with("BEGIN TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                        .await?
                }
            })
        })
        .await
    }

    /// A transaction that holds the write lock (SQLite) or takes row locks
    /// with `FOR UPDATE` (PostgreSQL).
    pub(crate) async fn begin_write(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
        self.bounded(async {
            Ok(match self.dialect {
                Dialect::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
                Dialect::Postgres => self.pool.begin().await?,
            })
        })
        .await
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        if self.dialect == Dialect::Postgres {
            // Not bound by the per-call statement_timeout: waiting for
            // another replica's migration, or a slow index build, may take
            // longer than a request should. A bound of its own still ends a
            // start against a server that never answers.
            sqlx::query(AssertSqlSafe(format!(
                "SET LOCAL statement_timeout = {}",
                MIGRATION_TIMEOUT.as_millis()
            )))
            .execute(&mut *tx)
            .await?;
            // Replicas starting together migrate one at a time.
            sqlx::query("SELECT pg_advisory_xact_lock(7167001)")
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY)")
            .execute(&mut *tx)
            .await?;
        for (version, sqlite, postgres) in schema::MIGRATIONS {
            let done = sqlx::query("SELECT version FROM schema_migrations WHERE version = $1")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await?;
            if done.is_some() {
                continue;
            }
            let sql = match self.dialect {
                Dialect::Sqlite => sqlite,
                Dialect::Postgres => postgres,
            };
            for statement in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
                sqlx::query(statement).execute(&mut *tx).await?;
            }
            sqlx::query("INSERT INTO schema_migrations (version) VALUES ($1)")
                .bind(version)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    // ------------------------------------------------------------ sandboxes

    /// Inserts a new sandbox record and, when given, its create-time policy
    /// as the sandbox's policy scope (one transaction: a sandbox never exists
    /// without the policy it was created with).
    pub async fn insert(
        &self,
        sandbox: &Sandbox,
        token_hash: &str,
        driver_host: &str,
        policy: Option<&PolicySeed>,
    ) -> Result<(), StoreError> {
        self.insert_placed(sandbox, token_hash, driver_host, policy, None)
            .await
            .map(|_| ())
    }

    /// [`Store::insert`], and with `pool_ttl` the sandbox is assigned in the
    /// same transaction to the live supervisor host (seen within the TTL)
    /// serving the fewest sandboxes with room left ([`StoreError::NoHost`],
    /// [`StoreError::HostsFull`] otherwise). Returns that host.
    pub async fn insert_placed(
        &self,
        sandbox: &Sandbox,
        token_hash: &str,
        driver_host: &str,
        policy: Option<&PolicySeed>,
        pool_ttl: Option<Duration>,
    ) -> Result<Option<String>, StoreError> {
        self.bounded(async {
            let _token_written = TokenWriteGuard(&self.token_writes);
            let meta = sandbox.metadata.as_ref().expect("metadata");
            let created_ms = meta
                .created_time
                .as_ref()
                .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
                .unwrap_or_default();
            let mut tx = self.begin_write().await?;
            let host = match pool_ttl {
                Some(ttl) => Some(self.pick_host(&mut tx, ttl, None).await?),
                None => None,
            };
            let result = sqlx::query(
                "INSERT INTO sandboxes (id, name, resource_version, record, token_hash, driver_host, created_ms, host_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(&meta.id)
            .bind(&meta.name)
            .bind(meta.resource_version as i64)
            .bind(sandbox.encode_to_vec())
            .bind(token_hash)
            .bind(driver_host)
            .bind(created_ms)
            .bind(host.clone())
            .execute(&mut *tx)
            .await;
            match result {
                Ok(_) => {}
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    return Err(StoreError::AlreadyExists);
                }
                Err(e) => return Err(e.into()),
            }
            if let Some(seed) = policy {
                sqlx::query(
                    "INSERT INTO config_scopes (owner, policy_version, policy, policy_hash, settings_revision)
                     VALUES ($1, $2, $3, $4, 0)",
                )
                .bind(&meta.id)
                .bind(seed.version)
                .bind(seed.encoded.clone())
                .bind(&seed.hash)
                .execute(&mut *tx)
                .await?;
            }
            self.record_event(
                &mut tx,
                &meta.id,
                EventKind::Status,
                Some(sandbox.encode_to_vec()),
            )
            .await?;
            tx.commit().await?;
            Ok(host)
        })
        .await
    }

    pub async fn get_by_name(&self, name: &str) -> Result<StoredSandbox, StoreError> {
        self.bounded(async {
            let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE name = $1");
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(name)
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::NotFound)?;
            decode_row(&row)
        })
        .await
    }

    pub async fn get_by_id(&self, id: &str) -> Result<StoredSandbox, StoreError> {
        self.bounded(async {
            let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = $1");
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(id)
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::NotFound)?;
            decode_row(&row)
        })
        .await
    }

    /// The sandbox id a supervisor token hash belongs to.
    pub async fn sandbox_for_token(&self, token_hash: &str) -> Result<Option<String>, StoreError> {
        self.bounded(async {
            let row = sqlx::query("SELECT id FROM sandboxes WHERE token_hash = $1")
                .bind(token_hash)
                .fetch_optional(&self.pool)
                .await?;
            Ok(row.map(|r| r.get::<String, _>(0)))
        })
        .await
    }

    /// Sandboxes ordered by name, starting after `after`.
    pub async fn list_after(
        &self,
        after: &str,
        limit: i64,
    ) -> Result<Vec<StoredSandbox>, StoreError> {
        self.bounded(async {
            let sql = format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE name > $1 ORDER BY name LIMIT $2"
            );
            let rows = sqlx::query(AssertSqlSafe(sql))
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
            rows.iter().map(decode_row).collect()
        })
        .await
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
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            let sql = format!(
                "SELECT record FROM sandboxes WHERE id = $1{}",
                self.dialect.lock_row()
            );
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(StoreError::NotFound)?;
            let mut sandbox = Sandbox::decode(row.get::<Vec<u8>, _>(0).as_slice())?;
            change(&mut sandbox);
            let meta = sandbox.metadata.get_or_insert_with(Default::default);
            meta.resource_version += 1;
            let version = meta.resource_version as i64;
            sqlx::query("UPDATE sandboxes SET record = $1, resource_version = $2 WHERE id = $3")
                .bind(sandbox.encode_to_vec())
                .bind(version)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            self.record_event(
                &mut tx,
                id,
                EventKind::Status,
                Some(sandbox.encode_to_vec()),
            )
            .await?;
            tx.commit().await?;
            Ok(sandbox)
        })
        .await
    }

    /// Sets the supervisor pid (and optionally a new token hash) only if the
    /// stored pid is still `expected`; false when another replica got there first.
    pub async fn swap_supervisor(
        &self,
        id: &str,
        expected: i64,
        pid: i64,
        token_hash: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.bounded(async {
            let _token_written = token_hash.map(|_| TokenWriteGuard(&self.token_writes));
            let result = match token_hash {
                Some(hash) => sqlx::query(
                    "UPDATE sandboxes SET supervisor_pid = $1, token_hash = $2
                     WHERE id = $3 AND supervisor_pid = $4",
                )
                .bind(pid)
                .bind(hash)
                .bind(id)
                .bind(expected),
                None => sqlx::query(
                    "UPDATE sandboxes SET supervisor_pid = $1 WHERE id = $2 AND supervisor_pid = $3",
                )
                .bind(pid)
                .bind(id)
                .bind(expected),
            }
            .execute(&self.pool)
            .await?;
            Ok(result.rows_affected() == 1)
        })
        .await
    }

    pub async fn delete(&self, id: &str) -> Result<(), StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            sqlx::query("DELETE FROM sandboxes WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM session_owners WHERE sandbox_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            // Its SSH session tokens die with it.
            sqlx::query("DELETE FROM ssh_sessions WHERE sandbox_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            // Its configuration goes with it ('' is the global scope).
            for table in ["config_scopes", "config_settings"] {
                let sql = format!("DELETE FROM {table} WHERE owner = $1 AND owner <> ''");
                sqlx::query(AssertSqlSafe(sql))
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
            self.record_event(&mut tx, id, EventKind::Deleted, None)
                .await?;
            self.forget_events(&mut tx, id).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn decode_row(row: &AnyRow) -> Result<StoredSandbox, StoreError> {
    let record: Vec<u8> = row.get(0);
    Ok(StoredSandbox {
        sandbox: Sandbox::decode(record.as_slice())?,
        supervisor_pid: row.get::<i64, _>(1),
        driver_host: row.get::<String, _>(2),
    })
}
