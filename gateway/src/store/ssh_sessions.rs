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
            let sql = format!(
                "DELETE FROM ssh_sessions WHERE token_hash IN (
                    SELECT token_hash FROM ssh_sessions
                    WHERE revoked <> 0 OR (expires_ms <> 0 AND expires_ms <= {})
                    LIMIT $1)",
                self.dialect.now_ms()
            );
            let result = sqlx::query(AssertSqlSafe(sql))
                .bind(limit)
                .execute(&self.pool)
                .await?;
            Ok(result.rows_affected())
        })
        .await
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
