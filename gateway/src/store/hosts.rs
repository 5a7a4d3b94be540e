//! Shared supervisor hosts: their tokens (SHA-256 hashes only), which
//! replica holds each host's session, and which host each pooled sandbox is
//! assigned to (`sandboxes.host_id`).
//!
//! Host placement and sandbox placement each run in one write transaction
//! that replicas take one at a time (SQLite's write lock; a transaction-level
//! advisory lock on PostgreSQL), so hosts arriving together are counted one
//! after the other and never overfill a replica, and sandboxes created
//! together never overfill a host.

use super::*;

/// PostgreSQL advisory lock keys (the migration uses 7167001).
const HOST_PLACEMENT_LOCK: i64 = 7_167_002;
pub(super) const SANDBOX_PLACEMENT_LOCK: i64 = 7_167_003;

/// A host the store counts against a replica: its session is held there,
/// or a redirect sent it there a moment ago.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSeat {
    pub host_id: String,
    pub replica_id: String,
}

impl Store {
    /// Creates host `host_id` with this token hash, or gives an existing
    /// host the new hash: the old token stops working, and the session it
    /// opened loses its seat (its next renewal fails and the replica ends
    /// it), so a rotated token takes a live session with it.
    pub async fn set_host_token(&self, host_id: &str, token_hash: &str) -> Result<(), StoreError> {
        self.bounded(async {
            let _token_written = TokenWriteGuard(&self.token_writes);
            let sql = format!(
                "INSERT INTO hosts (id, token_hash, created_ms) VALUES ($1, $2, {})
                 ON CONFLICT (id) DO UPDATE SET token_hash = $3, replica_id = NULL, session_id = ''",
                self.dialect.now_ms()
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(host_id)
                .bind(token_hash)
                .bind(token_hash)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
        .await
    }

    /// The host a host token hash belongs to.
    pub async fn host_for_token(&self, token_hash: &str) -> Result<Option<String>, StoreError> {
        self.bounded(async {
            let row = sqlx::query("SELECT id FROM hosts WHERE token_hash = $1")
                .bind(token_hash)
                .fetch_optional(&self.pool)
                .await?;
            Ok(row.map(|r| r.get::<String, _>(0)))
        })
        .await
    }

    /// Places host `host_id` in one serialised transaction: reads every
    /// other host seated within `ttl` (database time), lets `choose` pick a
    /// replica from them, and seats the host there (no session yet) before
    /// answering, so the next arrival counts it. `None` from `choose`
    /// changes nothing.
    ///
    /// `attempt` (the arriving hello's instance id and connection epoch):
    /// an attempt older than the live session of the same host instance
    /// changes nothing and fails [`StoreError::Superseded`].
    pub async fn place_host(
        &self,
        host_id: &str,
        ttl: Duration,
        attempt: Option<(&str, u64)>,
        choose: impl FnOnce(&[HostSeat]) -> Option<String>,
    ) -> Result<Option<String>, StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            if self.dialect == Dialect::Postgres {
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(HOST_PLACEMENT_LOCK)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some((instance_id, epoch)) = attempt
                && let Some(newer) = self
                    .newer_host_session(&mut tx, host_id, instance_id, epoch, ttl)
                    .await?
            {
                return Err(StoreError::Superseded(newer));
            }
            let sql = format!(
                "SELECT id, replica_id FROM hosts
                 WHERE replica_id IS NOT NULL AND id <> $1 AND seen_ms > {} - $2",
                self.dialect.now_ms()
            );
            let seats: Vec<HostSeat> = sqlx::query(AssertSqlSafe(sql))
                .bind(host_id)
                .bind(ttl.as_millis() as i64)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| HostSeat {
                    host_id: r.get(0),
                    replica_id: r.get(1),
                })
                .collect();
            let Some(target) = choose(&seats) else {
                return Ok(None);
            };
            let sql = format!(
                "UPDATE hosts SET replica_id = $1, session_id = '', seen_ms = {} WHERE id = $2",
                self.dialect.now_ms()
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(&target)
                .bind(host_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Some(target))
        })
        .await
    }

    /// Records that `replica_id` holds the host's session `session_id`,
    /// opened by connection `epoch` of host instance `instance_id`. Fails
    /// [`StoreError::Superseded`], changing nothing, when a live session of
    /// the same instance came from a later attempt (on any replica).
    pub async fn hold_host(
        &self,
        host_id: &str,
        replica_id: &str,
        session_id: &str,
        (instance_id, epoch): (&str, u64),
        capacity: u32,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            if self.dialect == Dialect::Postgres {
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(HOST_PLACEMENT_LOCK)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(newer) = self
                .newer_host_session(&mut tx, host_id, instance_id, epoch, ttl)
                .await?
            {
                return Err(StoreError::Superseded(newer));
            }
            let sql = format!(
                "UPDATE hosts SET replica_id = $1, session_id = $2, instance_id = $3,
                    capacity = $4, connection_epoch = $5, seen_ms = {} WHERE id = $6",
                self.dialect.now_ms()
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(replica_id)
                .bind(session_id)
                .bind(instance_id)
                .bind(i64::from(capacity))
                .bind(epoch_column(epoch))
                .bind(host_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Inside a host placement transaction: the epoch of the host's live
    /// session (renewed within `ttl`) when it is the same instance's and
    /// newer than `epoch`.
    async fn newer_host_session(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        host_id: &str,
        instance_id: &str,
        epoch: u64,
        ttl: Duration,
    ) -> Result<Option<u64>, StoreError> {
        let sql = format!(
            "SELECT instance_id, connection_epoch FROM hosts
             WHERE id = $1 AND replica_id IS NOT NULL AND session_id <> ''
               AND seen_ms > {} - $2",
            self.dialect.now_ms()
        );
        let Some(row) = sqlx::query(AssertSqlSafe(sql))
            .bind(host_id)
            .bind(ttl.as_millis() as i64)
            .fetch_optional(&mut **tx)
            .await?
        else {
            return Ok(None);
        };
        let live_instance: String = row.get(0);
        let live_epoch = row.get::<i64, _>(1).max(0) as u64;
        Ok(is_stale((&live_instance, live_epoch), instance_id, epoch).then_some(live_epoch))
    }

    /// Renews the host's seat if session `session_id` still holds it.
    pub async fn renew_host(&self, host_id: &str, session_id: &str) -> Result<bool, StoreError> {
        self.bounded(async {
            let sql = format!(
                "UPDATE hosts SET seen_ms = {} WHERE id = $1 AND session_id = $2",
                self.dialect.now_ms()
            );
            let result = sqlx::query(AssertSqlSafe(sql))
                .bind(host_id)
                .bind(session_id)
                .execute(&self.pool)
                .await?;
            Ok(result.rows_affected() == 1)
        })
        .await
    }

    /// Frees the host's seat if session `session_id` still holds it.
    pub async fn release_host(&self, host_id: &str, session_id: &str) -> Result<(), StoreError> {
        self.bounded(async {
            sqlx::query(
                "UPDATE hosts SET replica_id = NULL, session_id = '' WHERE id = $1 AND session_id = $2",
            )
            .bind(host_id)
            .bind(session_id)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
        .await
    }

    /// The sandboxes assigned to a host, by name.
    pub async fn host_assignment(&self, host_id: &str) -> Result<Vec<Sandbox>, StoreError> {
        self.bounded(async {
            let rows = sqlx::query("SELECT record FROM sandboxes WHERE host_id = $1 ORDER BY name")
                .bind(host_id)
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|r| Ok(Sandbox::decode(r.get::<Vec<u8>, _>(0).as_slice())?))
                .collect()
        })
        .await
    }

    /// The host a sandbox is assigned to (`None`: none, or no such sandbox).
    pub async fn sandbox_host(&self, sandbox_id: &str) -> Result<Option<String>, StoreError> {
        self.bounded(async {
            let row = sqlx::query("SELECT host_id FROM sandboxes WHERE id = $1")
                .bind(sandbox_id)
                .fetch_optional(&self.pool)
                .await?;
            Ok(row.and_then(|r| r.get::<Option<String>, _>(0)))
        })
        .await
    }

    /// Inside a sandbox insert: the live host (a session renewed within
    /// `ttl`) with the fewest sandboxes and room for one more, other than
    /// `except`.
    pub(super) async fn pick_host(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        ttl: Duration,
        except: Option<&str>,
    ) -> Result<String, StoreError> {
        if self.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(SANDBOX_PLACEMENT_LOCK)
                .execute(&mut **tx)
                .await?;
        }
        let sql = format!(
            "SELECT h.id, h.capacity, (SELECT COUNT(*) FROM sandboxes s WHERE s.host_id = h.id)
             FROM hosts h
             WHERE h.replica_id IS NOT NULL AND h.session_id <> '' AND h.seen_ms > {} - $1",
            self.dialect.now_ms()
        );
        let mut live: Vec<(i64, String, i64)> = sqlx::query(AssertSqlSafe(sql))
            .bind(ttl.as_millis() as i64)
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .filter(|r| except.is_none_or(|host| r.get::<String, _>(0) != host))
            .map(|r| {
                (
                    r.get::<i64, _>(2),
                    r.get::<String, _>(0),
                    r.get::<i64, _>(1),
                )
            })
            .collect();
        if live.is_empty() {
            return Err(StoreError::NoHost);
        }
        live.sort();
        live.into_iter()
            .find(|(count, _, capacity)| *capacity == 0 || count < capacity)
            .map(|(_, id, _)| id)
            .ok_or(StoreError::HostsFull)
    }
}

/// Epochs are u64 on the wire and BIGINT in the store: larger ones are
/// stored as the largest BIGINT (no client counts that far; the order of
/// those it does count is kept).
fn epoch_column(epoch: u64) -> i64 {
    i64::try_from(epoch).unwrap_or(i64::MAX)
}
