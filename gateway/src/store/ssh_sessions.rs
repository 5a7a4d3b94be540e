//! SSH session tokens: their hashes, expiry and revocation
//! (`CreateSshSession`, `RevokeSshSession`, token-only `ForwardTcp`).

use super::*;

impl Store {
    /// Records a new SSH session token hash for `sandbox_id`, expiring
    /// `ttl_ms` from now by the database's clock (0: never). Returns the
    /// expiry in milliseconds since the epoch (0: none). Ended sessions go
    /// in [`Store::purge_ended_ssh_sessions`].
    pub async fn insert_ssh_session(
        &self,
        token_hash: &str,
        sandbox_id: &str,
        ttl_ms: i64,
    ) -> Result<i64, StoreError> {
        self.bounded(async {
            let mut tx = self.begin_write().await?;
            let now: i64 = sqlx::query(AssertSqlSafe(format!("SELECT {}", self.dialect.now_ms())))
                .fetch_one(&mut *tx)
                .await?
                .get(0);
            let expires = if ttl_ms > 0 {
                now.saturating_add(ttl_ms)
            } else {
                0
            };
            sqlx::query(
                "INSERT INTO ssh_sessions (token_hash, sandbox_id, created_ms, expires_ms, revoked)
                 VALUES ($1, $2, $3, $4, 0)",
            )
            .bind(token_hash)
            .bind(sandbox_id)
            .bind(now)
            .bind(expires)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(expires)
        })
        .await
    }

    /// The state of the SSH session whose token hashes to `token_hash`.
    pub async fn ssh_session(
        &self,
        token_hash: &str,
    ) -> Result<Option<SshSessionState>, StoreError> {
        self.bounded(async {
            let now = self.dialect.now_ms();
            let sql = format!(
                "SELECT sandbox_id, revoked,
                    CASE WHEN expires_ms <> 0 AND expires_ms <= {now} THEN 1 ELSE 0 END,
                    CASE WHEN expires_ms = 0 THEN -1 ELSE expires_ms - {now} END
                 FROM ssh_sessions WHERE token_hash = $1"
            );
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(token_hash)
                .fetch_optional(&self.pool)
                .await?;
            Ok(row.map(|r| SshSessionState {
                sandbox_id: r.get(0),
                revoked: r.get::<i64, _>(1) != 0,
                expired: r.get::<i64, _>(2) != 0,
                expires_in: u64::try_from(r.get::<i64, _>(3))
                    .ok()
                    .map(Duration::from_millis),
            }))
        })
        .await
    }

    /// Deletes up to `limit` SSH sessions that ended (revoked, or past
    /// their expiry by the database's clock); returns how many went.
    pub async fn purge_ended_ssh_sessions(&self, limit: i64) -> Result<u64, StoreError> {
        self.bounded(async {
            let result = sqlx::query(AssertSqlSafe(self.purge_ended_ssh_sessions_sql()))
                .bind(limit)
                .execute(&self.pool)
                .await?;
            Ok(result.rows_affected())
        })
        .await
    }

    /// The purge's statement (`$1`: the limit), apart for its query-plan test.
    /// Each side of the OR is a range one of the partial indexes of schema
    /// version 5 serves: `revoked > 0`, and `expires_ms > 0 AND expires_ms
    /// <= now` (`revoked` is 0 or 1 and `expires_ms` never negative, so
    /// `> 0` means `<> 0`, which neither database searches an index by).
    /// The clock is the statement's: PostgreSQL searches an index by
    /// `statement_timestamp()`, never by the volatile `clock_timestamp()`.
    fn purge_ended_ssh_sessions_sql(&self) -> String {
        format!(
            "DELETE FROM ssh_sessions WHERE token_hash IN (
                SELECT token_hash FROM ssh_sessions
                WHERE revoked > 0 OR (expires_ms > 0 AND expires_ms <= {})
                LIMIT $1)",
            self.dialect.statement_now_ms()
        )
    }

    /// Revokes the SSH session of `token_hash`. True when it was live (known,
    /// not revoked, not expired) and is revoked now; a second revoke, or an
    /// unknown hash, is false and changes nothing.
    pub async fn revoke_ssh_session(&self, token_hash: &str) -> Result<bool, StoreError> {
        self.bounded(async {
            let sql = format!(
                "UPDATE ssh_sessions SET revoked = 1 WHERE token_hash = $1 AND revoked = 0
                 AND (expires_ms = 0 OR expires_ms > {})",
                self.dialect.now_ms()
            );
            let result = sqlx::query(AssertSqlSafe(sql))
                .bind(token_hash)
                .execute(&self.pool)
                .await?;
            Ok(result.rows_affected() == 1)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sqlite_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = Store::open(&url, StoreOptions::default()).await.unwrap();
        (dir, store)
    }

    /// The purge runs every few seconds over every session ever issued and
    /// not yet purged: it must find the ended ones through an index, not by
    /// reading the whole table.
    #[tokio::test]
    async fn the_purge_searches_indexes_instead_of_scanning_the_table() {
        let (_dir, store) = sqlite_store().await;
        let sql = format!(
            "EXPLAIN QUERY PLAN {}",
            store.purge_ended_ssh_sessions_sql()
        );
        let plan: Vec<String> = sqlx::query(AssertSqlSafe(sql))
            .bind(100_i64)
            .fetch_all(&store.pool)
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<String, _>(3))
            .collect();
        let plan = plan.join("\n");
        assert!(
            !plan.lines().any(|line| line.starts_with("SCAN ")),
            "a full scan in the purge's plan:\n{plan}"
        );
        for index in ["ssh_sessions_revoked", "ssh_sessions_expiring"] {
            assert!(
                plan.contains(&format!("INDEX {index} ")),
                "{index} unused:\n{plan}"
            );
        }
        store.close().await;
    }

    /// The same on PostgreSQL, with sequential scans priced out (an empty
    /// table would otherwise be read whole, index or not): the bitmap scans
    /// of both indexes, the expiry bound as an index condition.
    #[tokio::test]
    async fn the_purge_searches_indexes_on_postgres() {
        let pg = openshell_testkit::cluster::Postgres::start();
        let store = Store::open(&pg.url(), StoreOptions::default())
            .await
            .unwrap();
        let mut conn = store.pool.acquire().await.unwrap();
        sqlx::query("SET enable_seqscan = off")
            .execute(&mut *conn)
            .await
            .unwrap();
        let sql = format!("EXPLAIN {}", store.purge_ended_ssh_sessions_sql());
        let plan: Vec<String> = sqlx::query(AssertSqlSafe(sql))
            .bind(100_i64)
            .fetch_all(&mut *conn)
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<String, _>(0))
            .collect();
        let plan = plan.join("\n");
        assert!(!plan.contains("Seq Scan"), "a full scan:\n{plan}");
        for index in ["ssh_sessions_revoked", "ssh_sessions_expiring"] {
            assert!(
                plan.contains(&format!("Index Scan on {index} ")),
                "{index} unused:\n{plan}"
            );
        }
        assert!(
            plan.lines()
                .any(|line| line.contains("Index Cond:") && line.contains("expires_ms <=")),
            "the expiry bound is no index condition:\n{plan}"
        );
        drop(conn);
        store.close().await;
    }

    /// The purge takes exactly the revoked and the expired sessions, never
    /// the live ones or those without an expiry.
    #[tokio::test]
    async fn the_purge_takes_ended_sessions_only() {
        let (_dir, store) = sqlite_store().await;
        // (token hash, expires_ms, revoked): 1 ms after the epoch is long
        // past, i64::MAX never comes, 0 is "no expiry".
        let rows = [
            ("live", i64::MAX, 0),
            ("forever", 0, 0),
            ("expired", 1, 0),
            ("revoked", i64::MAX, 1),
            ("revoked-forever", 0, 1),
        ];
        for (hash, expires, revoked) in rows {
            sqlx::query(
                "INSERT INTO ssh_sessions (token_hash, sandbox_id, created_ms, expires_ms, revoked)
                 VALUES ($1, 's', 0, $2, $3)",
            )
            .bind(hash)
            .bind(expires)
            .bind(revoked)
            .execute(&store.pool)
            .await
            .unwrap();
        }
        assert_eq!(store.purge_ended_ssh_sessions(100).await.unwrap(), 3);
        let mut left: Vec<String> = sqlx::query("SELECT token_hash FROM ssh_sessions")
            .fetch_all(&store.pool)
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        left.sort();
        assert_eq!(left, ["forever", "live"]);
        store.close().await;
    }
}
