//! The event log (`sandbox_events`): every sandbox status change (with the
//! record as it became), every recorded log line, every deletion, in one
//! sequence. Its numbers are the cursors of `WatchSandbox`, so a watcher
//! anywhere in the cluster resumes exactly after the last event it got.
//!
//! Order: a cursor is only sound when no event with a smaller number can
//! become visible after one with a larger number. SQLite writers take the
//! database lock (`BEGIN IMMEDIATE`), so they commit in number order.
//! PostgreSQL hands out `BIGSERIAL` numbers before commit, so two writers
//! could commit out of order: every transaction that appends takes one
//! transaction-scoped advisory lock first, and numbers are taken under it.
//!
//! Trimming: a sandbox keeps its newest [`STATUS_KEEP`] status events and
//! its newest `keep` log lines (`--sandbox-log-lines`); `event_floors` keeps
//! the newest number trimmed of each kind, so a watcher behind it is told it
//! missed events instead of silently skipping them. A deleted sandbox's
//! events go with it; only the deletion stays, for [`DELETED_TTL`]. The
//! newest event of all is never pruned: the log's head (`MAX(seq)`) never
//! goes back, so a cursor handed out stays at or behind it.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Row};

use super::{Dialect, Store, StoreError, StoredSandbox, decode_row};

/// PostgreSQL advisory lock key serialising appends (see the module).
const EVENT_ORDER_LOCK: i64 = 7_167_004;
/// Status events kept per sandbox.
pub const STATUS_KEEP: i64 = 256;
/// How long the deletion event of a sandbox stays.
pub const DELETED_TTL: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Status,
    Log,
    Deleted,
}

impl EventKind {
    fn as_str(self) -> &'static str {
        match self {
            EventKind::Status => "status",
            EventKind::Log => "log",
            EventKind::Deleted => "deleted",
        }
    }
}

/// One row of the log: its number, kind and encoded record (`Sandbox` for
/// status, `SandboxLogLine` for log; empty for a deletion or an event
/// written before records were kept).
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub seq: i64,
    pub kind: EventKind,
    pub record: Vec<u8>,
}

/// The events of one sandbox after a cursor, read in one snapshot with the
/// floors that say whether any were trimmed.
#[derive(Debug, Clone, Default)]
pub struct EventBatch {
    pub status_floor: i64,
    pub log_floor: i64,
    pub events: Vec<StoredEvent>,
}

/// A change to some sandbox, as the cross-replica follower sees it.
#[derive(Debug, Clone)]
pub struct SandboxEvent {
    pub seq: i64,
    pub sandbox_id: String,
}

impl Store {
    /// Takes the append lock (PostgreSQL; SQLite's write transaction
    /// already is one).
    async fn lock_events(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    ) -> Result<(), StoreError> {
        if self.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(EVENT_ORDER_LOCK)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    /// Appends one event inside `tx`; its number. Callers make it the last
    /// write of their transaction but for trimming (the append lock is held
    /// until commit).
    pub(crate) async fn record_event(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        sandbox_id: &str,
        kind: EventKind,
        record: Option<Vec<u8>>,
    ) -> Result<i64, StoreError> {
        self.lock_events(tx).await?;
        let sql = format!(
            "INSERT INTO sandbox_events (sandbox_id, deleted, created_ms, kind, record)
             VALUES ($1, $2, {}, $3, $4) RETURNING seq",
            self.dialect.now_ms()
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(sandbox_id)
            .bind(i64::from(kind == EventKind::Deleted))
            .bind(kind.as_str())
            .bind(record)
            .fetch_one(&mut **tx)
            .await?;
        Ok(row.get::<i64, _>(0))
    }

    /// Removes a sandbox's status and log events and its floors (its
    /// deletion event stays); in the deleting transaction, after the
    /// deletion event took the append lock.
    pub(crate) async fn forget_events(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        sandbox_id: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sandbox_events WHERE sandbox_id = $1 AND deleted = 0")
            .bind(sandbox_id)
            .execute(&mut **tx)
            .await?;
        sqlx::query("DELETE FROM event_floors WHERE sandbox_id = $1")
            .bind(sandbox_id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Drops a sandbox's events of `kind` older than its newest `keep`,
    /// raising its floor for that kind.
    async fn trim(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        sandbox_id: &str,
        kind: EventKind,
        keep: i64,
    ) -> Result<(), StoreError> {
        let cut = sqlx::query(
            "SELECT seq FROM sandbox_events WHERE sandbox_id = $1 AND kind = $2
             ORDER BY seq DESC LIMIT 1 OFFSET $3",
        )
        .bind(sandbox_id)
        .bind(kind.as_str())
        .bind(keep)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(cut) = cut.map(|row| row.get::<i64, _>(0)) else {
            return Ok(());
        };
        sqlx::query("DELETE FROM sandbox_events WHERE sandbox_id = $1 AND kind = $2 AND seq <= $3")
            .bind(sandbox_id)
            .bind(kind.as_str())
            .bind(cut)
            .execute(&mut **tx)
            .await?;
        let column = match kind {
            EventKind::Log => "log_floor",
            _ => "status_floor",
        };
        let sql = format!(
            "INSERT INTO event_floors (sandbox_id, {column}) VALUES ($1, $2)
             ON CONFLICT (sandbox_id) DO UPDATE SET {column} = excluded.{column}"
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(sandbox_id)
            .bind(cut)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// This store's sequence space: a random number made once, so a cursor
    /// from another cluster's store is recognised as foreign.
    pub async fn event_space(&self) -> Result<i64, StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            let candidate = i64::from_be_bytes(rand::random::<[u8; 8]>()) & i64::MAX;
            sqlx::query(
                "INSERT INTO config_counters (name, value) VALUES ('event_space', $1)
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(candidate)
            .execute(&mut *tx)
            .await?;
            let row = sqlx::query("SELECT value FROM config_counters WHERE name = 'event_space'")
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(row.get::<i64, _>(0))
        })
        .await
    }

    /// Records log lines (encoded `SandboxLogLine`s) of an existing sandbox
    /// and trims its lines to the newest `keep`. With `mark` (a pusher and
    /// its message number), a message already recorded from that pusher is
    /// not recorded again: `false`.
    pub async fn append_logs(
        &self,
        sandbox_id: &str,
        lines: Vec<Vec<u8>>,
        keep: i64,
        mark: Option<(&str, i64)>,
    ) -> Result<bool, StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            let exists = sqlx::query("SELECT id FROM sandboxes WHERE id = $1")
                .bind(sandbox_id)
                .fetch_optional(&mut *tx)
                .await?;
            if exists.is_none() {
                return Err(StoreError::NotFound);
            }
            if let Some((pusher, sequence)) = mark {
                // Under the append lock: two copies of one message cannot
                // both find the mark unset.
                self.lock_events(&mut tx).await?;
                let last = sqlx::query(
                    "SELECT push_pusher, push_sequence FROM event_floors WHERE sandbox_id = $1",
                )
                .bind(sandbox_id)
                .fetch_optional(&mut *tx)
                .await?;
                if last.is_some_and(|row| {
                    row.get::<String, _>(0) == pusher && row.get::<i64, _>(1) >= sequence
                }) {
                    tx.commit().await?;
                    return Ok(false);
                }
            }
            for line in lines {
                self.record_event(&mut tx, sandbox_id, EventKind::Log, Some(line))
                    .await?;
            }
            self.trim(&mut tx, sandbox_id, EventKind::Log, keep).await?;
            if let Some((pusher, sequence)) = mark {
                sqlx::query(
                    "INSERT INTO event_floors (sandbox_id, push_pusher, push_sequence)
                     VALUES ($1, $2, $3)
                     ON CONFLICT (sandbox_id) DO UPDATE
                     SET push_pusher = excluded.push_pusher, push_sequence = excluded.push_sequence",
                )
                .bind(sandbox_id)
                .bind(pusher)
                .bind(sequence)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    /// A sandbox by name and the newest event number, from one snapshot:
    /// every status event up to that number is reflected in the record.
    pub async fn snapshot_with_head(&self, name: &str) -> Result<(StoredSandbox, i64), StoreError> {
        self.bounded(async {
            let mut tx = self.begin_read().await?;
            let sql = format!(
                "SELECT {} FROM sandboxes WHERE name = $1",
                super::SANDBOX_COLUMNS
            );
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(StoreError::NotFound)?;
            let stored = decode_row(&row)?;
            let head = sqlx::query("SELECT COALESCE(MAX(seq), 0) FROM sandbox_events")
                .fetch_one(&mut *tx)
                .await?
                .get::<i64, _>(0);
            tx.commit().await?;
            Ok((stored, head))
        })
        .await
    }

    /// Up to `limit` events of one sandbox after `after` (the kinds asked
    /// for, and always its deletion), with its floors, in one snapshot.
    pub async fn events_for(
        &self,
        sandbox_id: &str,
        after: i64,
        status: bool,
        logs: bool,
        limit: i64,
    ) -> Result<EventBatch, StoreError> {
        self.bounded(async {
            let mut tx = self.begin_read().await?;
            let floors = sqlx::query(
                "SELECT status_floor, log_floor FROM event_floors WHERE sandbox_id = $1",
            )
            .bind(sandbox_id)
            .fetch_optional(&mut *tx)
            .await?;
            let (status_floor, log_floor) = floors
                .map(|row| (row.get::<i64, _>(0), row.get::<i64, _>(1)))
                .unwrap_or_default();
            let mut kinds = vec!["'deleted'"];
            if status {
                kinds.push("'status'");
            }
            if logs {
                kinds.push("'log'");
            }
            let sql = format!(
                "SELECT seq, kind, record, deleted FROM sandbox_events
                 WHERE sandbox_id = $1 AND seq > $2 AND (deleted <> 0 OR kind IN ({}))
                 ORDER BY seq LIMIT $3",
                kinds.join(", ")
            );
            let rows = sqlx::query(AssertSqlSafe(sql))
                .bind(sandbox_id)
                .bind(after)
                .bind(limit)
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            let events = rows
                .iter()
                .map(|row| {
                    let kind = if row.get::<i64, _>(3) != 0 {
                        EventKind::Deleted
                    } else if row.get::<String, _>(1) == "log" {
                        EventKind::Log
                    } else {
                        EventKind::Status
                    };
                    StoredEvent {
                        seq: row.get(0),
                        kind,
                        record: row.get::<Option<Vec<u8>>, _>(2).unwrap_or_default(),
                    }
                })
                .collect();
            Ok(EventBatch {
                status_floor,
                log_floor,
                events,
            })
        })
        .await
    }

    /// Every recorded log line of a sandbox (number, encoded line), oldest
    /// first.
    pub async fn log_lines(&self, sandbox_id: &str) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        self.bounded(async {
            let rows = sqlx::query(
                "SELECT seq, record FROM sandbox_events WHERE sandbox_id = $1 AND kind = 'log'
                 ORDER BY seq",
            )
            .bind(sandbox_id)
            .fetch_all(&self.pool)
            .await?;
            Ok(rows
                .iter()
                .map(|row| {
                    (
                        row.get::<i64, _>(0),
                        row.get::<Option<Vec<u8>>, _>(1).unwrap_or_default(),
                    )
                })
                .collect())
        })
        .await
    }

    /// The newest event sequence number (0 when none).
    pub async fn last_event_seq(&self) -> Result<i64, StoreError> {
        self.bounded(async {
            let row = sqlx::query("SELECT COALESCE(MAX(seq), 0) FROM sandbox_events")
                .fetch_one(&self.pool)
                .await?;
            Ok(row.get::<i64, _>(0))
        })
        .await
    }

    pub async fn events_after(
        &self,
        seq: i64,
        limit: i64,
    ) -> Result<Vec<SandboxEvent>, StoreError> {
        self.bounded(async {
            let rows = sqlx::query(
                "SELECT seq, sandbox_id FROM sandbox_events WHERE seq > $1 ORDER BY seq LIMIT $2",
            )
            .bind(seq)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
            Ok(rows
                .iter()
                .map(|r| SandboxEvent {
                    seq: r.get(0),
                    sandbox_id: r.get(1),
                })
                .collect())
        })
        .await
    }

    /// Trims every sandbox's status events to [`STATUS_KEEP`] and drops
    /// deletion events (and rows of sandboxes that no longer exist) older
    /// than `age` by database time.
    pub async fn prune_events(&self, age: Duration) -> Result<(), StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            self.lock_events(&mut tx).await?;
            let sql = format!(
                "DELETE FROM sandbox_events WHERE created_ms < {} - $1
                 AND (deleted <> 0 OR sandbox_id NOT IN (SELECT id FROM sandboxes))
                 AND seq < (SELECT MAX(seq) FROM sandbox_events)",
                self.dialect.now_ms()
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(age.as_millis() as i64)
                .execute(&mut *tx)
                .await?;
            // A floor row a log append re-created while its sandbox was
            // being deleted.
            sqlx::query(
                "DELETE FROM event_floors WHERE sandbox_id NOT IN (SELECT id FROM sandboxes)",
            )
            .execute(&mut *tx)
            .await?;
            let crowded = sqlx::query(
                "SELECT sandbox_id FROM sandbox_events WHERE kind = 'status' AND deleted = 0
                 GROUP BY sandbox_id HAVING COUNT(*) > $1",
            )
            .bind(STATUS_KEEP)
            .fetch_all(&mut *tx)
            .await?;
            for row in crowded {
                let id: String = row.get(0);
                self.trim(&mut tx, &id, EventKind::Status, STATUS_KEEP)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }
}
