//! Pooled sandboxes whose supervisor host is gone (`--driver hosts`), and
//! sandboxes that changed driver: which ones there are, and moving each in
//! one write transaction that re-checks what the decision rests on (the
//! sandbox is still on that host, the host is still gone) under the same
//! serialisation as sandbox placement, so replicas sweeping at once move a
//! sandbox once and never onto an overfull host.

use super::hosts::SANDBOX_PLACEMENT_LOCK;
use super::*;

/// A pooled sandbox on a host with no live session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stranded {
    pub sandbox_id: String,
    /// The host it is assigned to; `None`: assigned to no host (a sandbox
    /// the process driver started).
    pub host_id: Option<String>,
}

/// What [`Store::resolve_stranded`] found for the sandbox, handed to the
/// caller's change.
#[derive(Debug)]
pub enum Placement {
    /// Assigned to this live host (the transaction moves it there if the
    /// change asks to write).
    Moved(String),
    /// No live host can take it now (`NoHost` or `HostsFull`).
    NoRoom(StoreError),
    /// Not moved: the caller keeps it where it is.
    Kept,
}

impl Store {
    /// Pooled sandboxes whose host has had no session renewing its seat for
    /// `lost_after` (database time), and, with `unplaced`, sandboxes
    /// assigned to no host at all. (Host records are never deleted, so a
    /// sandbox's host always has one.)
    pub async fn stranded_sandboxes(
        &self,
        lost_after: Duration,
        unplaced: bool,
    ) -> Result<Vec<Stranded>, StoreError> {
        self.bounded(async {
            // Lost hosts first (a handful of rows), then their sandboxes by
            // the `host_id` index: no scan of every sandbox each sweep.
            let sql = format!(
                "SELECT id, host_id FROM sandboxes
                 WHERE host_id IN (SELECT id FROM hosts WHERE seen_ms <= {} - $1){}
                 ORDER BY id",
                self.dialect.now_ms(),
                if unplaced {
                    " UNION ALL SELECT id, host_id FROM sandboxes WHERE host_id IS NULL"
                } else {
                    ""
                }
            );
            let rows = sqlx::query(AssertSqlSafe(sql))
                .bind(lost_after.as_millis() as i64)
                .fetch_all(&self.pool)
                .await?;
            Ok(rows
                .iter()
                .map(|r| Stranded {
                    sandbox_id: r.get(0),
                    host_id: r.get(1),
                })
                .collect())
        })
        .await
    }

    /// Resolves one stranded sandbox in one transaction: if it is still
    /// assigned to `stranded.host_id` and that host is still gone for
    /// `lost_after`, picks a live host (when `place` gives the seat TTL to
    /// count hosts live by) and hands the outcome to `change`, which edits
    /// the record and says whether to write. A write moves the sandbox to
    /// the host picked (if one was) and records the change as an event.
    /// `None`: nothing was written (the situation changed, or `change`
    /// declined).
    pub async fn resolve_stranded(
        &self,
        stranded: &Stranded,
        lost_after: Duration,
        place: Option<Duration>,
        change: impl FnOnce(&mut Sandbox, &Placement) -> bool,
    ) -> Result<Option<(Sandbox, Placement)>, StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            if self.dialect == Dialect::Postgres {
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(SANDBOX_PLACEMENT_LOCK)
                    .execute(&mut *tx)
                    .await?;
            }
            let sql = format!(
                "SELECT record, host_id FROM sandboxes WHERE id = $1{}",
                self.dialect.lock_row()
            );
            let Some(row) = sqlx::query(AssertSqlSafe(sql))
                .bind(&stranded.sandbox_id)
                .fetch_optional(&mut *tx)
                .await?
            else {
                return Ok(None);
            };
            if row.get::<Option<String>, _>(1) != stranded.host_id {
                return Ok(None);
            }
            if let Some(host) = &stranded.host_id {
                let sql = format!(
                    "SELECT 1 FROM hosts WHERE id = $1 AND seen_ms > {} - $2",
                    self.dialect.now_ms()
                );
                let back = sqlx::query(AssertSqlSafe(sql))
                    .bind(host)
                    .bind(lost_after.as_millis() as i64)
                    .fetch_optional(&mut *tx)
                    .await?;
                if back.is_some() {
                    return Ok(None);
                }
            }
            let mut sandbox = Sandbox::decode(row.get::<Vec<u8>, _>(0).as_slice())?;
            let placement = match place {
                // Never the lost host itself, whatever the two bounds.
                Some(ttl) => match self
                    .pick_host(&mut tx, ttl, stranded.host_id.as_deref())
                    .await
                {
                    Ok(host) => Placement::Moved(host),
                    Err(err @ (StoreError::NoHost | StoreError::HostsFull)) => {
                        Placement::NoRoom(err)
                    }
                    Err(err) => return Err(err),
                },
                None => Placement::Kept,
            };
            if !change(&mut sandbox, &placement) {
                return Ok(None);
            }
            let meta = sandbox.metadata.get_or_insert_with(Default::default);
            meta.resource_version += 1;
            let version = meta.resource_version as i64;
            let host = match &placement {
                Placement::Moved(host) => Some(host.as_str()),
                _ => stranded.host_id.as_deref(),
            };
            sqlx::query(
                "UPDATE sandboxes SET record = $1, resource_version = $2, host_id = $3 WHERE id = $4",
            )
            .bind(sandbox.encode_to_vec())
            .bind(version)
            .bind(host)
            .bind(&stranded.sandbox_id)
            .execute(&mut *tx)
            .await?;
            self.record_event(
                &mut tx,
                &stranded.sandbox_id,
                EventKind::Status,
                Some(sandbox.encode_to_vec()),
            )
            .await?;
            tx.commit().await?;
            Ok(Some((sandbox, placement)))
        })
        .await
    }

    /// Takes a sandbox off its supervisor host (the process driver adopts
    /// it), changing its record with `change` in the same transaction.
    /// Returns the host it was on; `None` (nothing written): it was on none.
    pub async fn take_off_host(
        &self,
        sandbox_id: &str,
        change: impl FnOnce(&mut Sandbox, &str),
    ) -> Result<Option<String>, StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            let sql = format!(
                "SELECT record, host_id FROM sandboxes WHERE id = $1{}",
                self.dialect.lock_row()
            );
            let Some(row) = sqlx::query(AssertSqlSafe(sql))
                .bind(sandbox_id)
                .fetch_optional(&mut *tx)
                .await?
            else {
                return Ok(None);
            };
            let Some(host) = row.get::<Option<String>, _>(1) else {
                return Ok(None);
            };
            let mut sandbox = Sandbox::decode(row.get::<Vec<u8>, _>(0).as_slice())?;
            change(&mut sandbox, &host);
            let meta = sandbox.metadata.get_or_insert_with(Default::default);
            meta.resource_version += 1;
            let version = meta.resource_version as i64;
            sqlx::query(
                "UPDATE sandboxes SET record = $1, resource_version = $2, host_id = NULL WHERE id = $3",
            )
            .bind(sandbox.encode_to_vec())
            .bind(version)
            .bind(sandbox_id)
            .execute(&mut *tx)
            .await?;
            self.record_event(
                &mut tx,
                sandbox_id,
                EventKind::Status,
                Some(sandbox.encode_to_vec()),
            )
            .await?;
            tx.commit().await?;
            Ok(Some(host))
        })
        .await
    }
}
