//! Cluster membership (replica rows stamped with database time) and sandbox
//! owners (which replica holds a sandbox's supervisor session).

use super::*;

impl Store {
    /// Registers or refreshes a replica, stamped with database time.
    pub async fn register_member(&self, member: &Member) -> Result<(), StoreError> {
        self.bounded(async {
            let now = self.dialect.now_ms();
            let sql = format!(
                "INSERT INTO gateway_members (replica_id, peer_endpoint, updated_ms) VALUES ($1, $2, {now})
                 ON CONFLICT (replica_id) DO UPDATE SET peer_endpoint = $3, updated_ms = {now}"
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(&member.replica_id)
                .bind(&member.peer_endpoint)
                .bind(&member.peer_endpoint)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
        .await
    }

    /// Replicas refreshed within `ttl` by database time, sorted by id.
    pub async fn live_members(&self, ttl: Duration) -> Result<Vec<Member>, StoreError> {
        self.bounded(async {
            let sql = format!(
                "SELECT replica_id, peer_endpoint FROM gateway_members
                 WHERE updated_ms > {} - $1 ORDER BY replica_id",
                self.dialect.now_ms()
            );
            let rows = sqlx::query(AssertSqlSafe(sql))
                .bind(ttl.as_millis() as i64)
                .fetch_all(&self.pool)
                .await?;
            Ok(rows
                .iter()
                .map(|r| Member {
                    replica_id: r.get(0),
                    peer_endpoint: r.get(1),
                })
                .collect())
        })
        .await
    }

    pub async fn remove_member(&self, replica_id: &str) -> Result<(), StoreError> {
        self.bounded(async {
            sqlx::query("DELETE FROM gateway_members WHERE replica_id = $1")
                .bind(replica_id)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
        .await
    }

    /// Deletes members not refreshed for `age` (database time).
    pub async fn sweep_members(&self, age: Duration) -> Result<(), StoreError> {
        self.bounded(async {
            let sql = format!(
                "DELETE FROM gateway_members WHERE updated_ms < {} - $1",
                self.dialect.now_ms()
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(age.as_millis() as i64)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
        .await
    }

    // ------------------------------------------------------------ ownership

    /// The owner record of a sandbox if it was renewed within `ttl`.
    pub async fn owner(
        &self,
        sandbox_id: &str,
        ttl: Duration,
    ) -> Result<Option<OwnerRecord>, StoreError> {
        self.bounded(async {
            let sql = format!(
                "SELECT sandbox_id, replica_id, peer_endpoint, session_id, instance_id, connection_epoch
                 FROM session_owners WHERE sandbox_id = $1 AND updated_ms > {} - $2",
                self.dialect.now_ms()
            );
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(sandbox_id)
                .bind(ttl.as_millis() as i64)
                .fetch_optional(&self.pool)
                .await?;
            Ok(row.as_ref().map(decode_owner))
        })
        .await
    }

    /// Publishes `record` as the owner unless `keep_existing` says the fresh
    /// record already there must stand. Returns the record that stands.
    pub async fn publish_owner(
        &self,
        record: &OwnerRecord,
        ttl: Duration,
        keep_existing: impl FnOnce(&OwnerRecord) -> bool,
    ) -> Result<Result<(), OwnerRecord>, StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            let sql = format!(
                "SELECT sandbox_id, replica_id, peer_endpoint, session_id, instance_id, connection_epoch
                 FROM session_owners WHERE sandbox_id = $1 AND updated_ms > {} - $2{}",
                self.dialect.now_ms(),
                self.dialect.lock_row()
            );
            let existing = sqlx::query(AssertSqlSafe(sql))
                .bind(&record.sandbox_id)
                .bind(ttl.as_millis() as i64)
                .fetch_optional(&mut *tx)
                .await?
                .as_ref()
                .map(decode_owner);
            if let Some(existing) = existing
                && keep_existing(&existing)
            {
                return Ok(Err(existing));
            }
            let now = self.dialect.now_ms();
            let sql = format!(
                "INSERT INTO session_owners
                    (sandbox_id, replica_id, peer_endpoint, session_id, instance_id, connection_epoch, updated_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, {now})
                 ON CONFLICT (sandbox_id) DO UPDATE SET replica_id = $7, peer_endpoint = $8,
                    session_id = $9, instance_id = $10, connection_epoch = $11, updated_ms = {now}"
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(&record.sandbox_id)
                .bind(&record.replica_id)
                .bind(&record.peer_endpoint)
                .bind(&record.session_id)
                .bind(&record.instance_id)
                .bind(record.connection_epoch)
                .bind(&record.replica_id)
                .bind(&record.peer_endpoint)
                .bind(&record.session_id)
                .bind(&record.instance_id)
                .bind(record.connection_epoch)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Ok(()))
        })
        .await
    }

    /// Renews the record if this session still holds it.
    pub async fn renew_owner(
        &self,
        sandbox_id: &str,
        session_id: &str,
    ) -> Result<bool, StoreError> {
        self.bounded(async {
            let sql = format!(
                "UPDATE session_owners SET updated_ms = {} WHERE sandbox_id = $1 AND session_id = $2",
                self.dialect.now_ms()
            );
            let result = sqlx::query(AssertSqlSafe(sql))
                .bind(sandbox_id)
                .bind(session_id)
                .execute(&self.pool)
                .await?;
            Ok(result.rows_affected() == 1)
        })
        .await
    }

    /// Drops the record if this session still holds it.
    pub async fn release_owner(
        &self,
        sandbox_id: &str,
        session_id: &str,
    ) -> Result<(), StoreError> {
        self.bounded(async {
            sqlx::query("DELETE FROM session_owners WHERE sandbox_id = $1 AND session_id = $2")
                .bind(sandbox_id)
                .bind(session_id)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
        .await
    }
}

fn decode_owner(row: &AnyRow) -> OwnerRecord {
    OwnerRecord {
        sandbox_id: row.get(0),
        replica_id: row.get(1),
        peer_endpoint: row.get(2),
        session_id: row.get(3),
        instance_id: row.get(4),
        connection_epoch: row.get(5),
    }
}
