//! The store's schema: every version's DDL, in SQLite's and PostgreSQL's
//! dialect, applied in order by `Store::migrate`.

/// Schema versions, applied in order, each once: (version, sqlite, postgres).
pub(super) const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        resource_version INTEGER NOT NULL,
        record BLOB NOT NULL,
        token_hash TEXT NOT NULL,
        supervisor_pid INTEGER NOT NULL DEFAULT 0,
        driver_host TEXT NOT NULL DEFAULT '',
        created_ms INTEGER NOT NULL
    );
    CREATE INDEX sandboxes_token_hash ON sandboxes (token_hash);
    CREATE TABLE sandbox_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        sandbox_id TEXT NOT NULL,
        deleted INTEGER NOT NULL,
        created_ms INTEGER NOT NULL
    );
    CREATE TABLE gateway_members (
        replica_id TEXT PRIMARY KEY,
        peer_endpoint TEXT NOT NULL,
        updated_ms INTEGER NOT NULL
    );
    CREATE TABLE session_owners (
        sandbox_id TEXT PRIMARY KEY,
        replica_id TEXT NOT NULL,
        peer_endpoint TEXT NOT NULL,
        session_id TEXT NOT NULL,
        instance_id TEXT NOT NULL,
        connection_epoch INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL
    )",
        "CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        resource_version BIGINT NOT NULL,
        record BYTEA NOT NULL,
        token_hash TEXT NOT NULL,
        supervisor_pid BIGINT NOT NULL DEFAULT 0,
        driver_host TEXT NOT NULL DEFAULT '',
        created_ms BIGINT NOT NULL
    );
    CREATE INDEX sandboxes_token_hash ON sandboxes (token_hash);
    CREATE TABLE sandbox_events (
        seq BIGSERIAL PRIMARY KEY,
        sandbox_id TEXT NOT NULL,
        deleted BIGINT NOT NULL,
        created_ms BIGINT NOT NULL
    );
    CREATE TABLE gateway_members (
        replica_id TEXT PRIMARY KEY,
        peer_endpoint TEXT NOT NULL,
        updated_ms BIGINT NOT NULL
    );
    CREATE TABLE session_owners (
        sandbox_id TEXT PRIMARY KEY,
        replica_id TEXT NOT NULL,
        peer_endpoint TEXT NOT NULL,
        session_id TEXT NOT NULL,
        instance_id TEXT NOT NULL,
        connection_epoch BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL
    )",
    ),
    // Configuration (config_model.rs). `owner` is a sandbox id, or '' for
    // the global scope. Policies are prost-encoded `SandboxPolicy`s; setting
    // values prost-encoded `SettingValue`s; provider environments
    // prost-encoded `Provider`s. `config_counters` holds `provider_seq`, the
    // sequence provider revisions and attachment epochs are taken from.
    (
        2,
        "CREATE TABLE config_scopes (
        owner TEXT PRIMARY KEY,
        policy_version INTEGER NOT NULL DEFAULT 0,
        policy BLOB,
        policy_hash TEXT NOT NULL DEFAULT '',
        settings_revision INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE config_settings (
        owner TEXT NOT NULL,
        key TEXT NOT NULL,
        value BLOB NOT NULL,
        PRIMARY KEY (owner, key)
    );
    CREATE TABLE providers (
        name TEXT PRIMARY KEY,
        record BLOB NOT NULL,
        revision INTEGER NOT NULL
    );
    CREATE TABLE config_counters (
        name TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    )",
        "CREATE TABLE config_scopes (
        owner TEXT PRIMARY KEY,
        policy_version BIGINT NOT NULL DEFAULT 0,
        policy BYTEA,
        policy_hash TEXT NOT NULL DEFAULT '',
        settings_revision BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE config_settings (
        owner TEXT NOT NULL,
        key TEXT NOT NULL,
        value BYTEA NOT NULL,
        PRIMARY KEY (owner, key)
    );
    CREATE TABLE providers (
        name TEXT PRIMARY KEY,
        record BYTEA NOT NULL,
        revision BIGINT NOT NULL
    );
    CREATE TABLE config_counters (
        name TEXT PRIMARY KEY,
        value BIGINT NOT NULL
    )",
    ),
    // SSH sessions (CreateSshSession): the SHA-256 of each token, never the
    // token; `expires_ms` by database time, 0 for none.
    (
        3,
        "CREATE TABLE ssh_sessions (
        token_hash TEXT PRIMARY KEY,
        sandbox_id TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL,
        revoked INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX ssh_sessions_sandbox ON ssh_sessions (sandbox_id)",
        "CREATE TABLE ssh_sessions (
        token_hash TEXT PRIMARY KEY,
        sandbox_id TEXT NOT NULL,
        created_ms BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        revoked BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX ssh_sessions_sandbox ON ssh_sessions (sandbox_id)",
    ),
    // Shared supervisor hosts (hosts.rs): the SHA-256 of each host token;
    // `replica_id` is the replica holding the host's session, or the one a
    // redirect sent it to (`session_id` still ''), NULL for none; `seen_ms`
    // by database time. `sandboxes.host_id` is the host a pooled sandbox is
    // assigned to (NULL for a sandbox with a supervisor of its own).
    (
        4,
        "CREATE TABLE hosts (
        id TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL,
        replica_id TEXT,
        session_id TEXT NOT NULL DEFAULT '',
        instance_id TEXT NOT NULL DEFAULT '',
        capacity INTEGER NOT NULL DEFAULT 0,
        seen_ms INTEGER NOT NULL DEFAULT 0,
        created_ms INTEGER NOT NULL
    );
    CREATE INDEX hosts_token_hash ON hosts (token_hash);
    ALTER TABLE sandboxes ADD COLUMN host_id TEXT;
    CREATE INDEX sandboxes_host_id ON sandboxes (host_id)",
        "CREATE TABLE hosts (
        id TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL,
        replica_id TEXT,
        session_id TEXT NOT NULL DEFAULT '',
        instance_id TEXT NOT NULL DEFAULT '',
        capacity BIGINT NOT NULL DEFAULT 0,
        seen_ms BIGINT NOT NULL DEFAULT 0,
        created_ms BIGINT NOT NULL
    );
    CREATE INDEX hosts_token_hash ON hosts (token_hash);
    ALTER TABLE sandboxes ADD COLUMN host_id TEXT;
    CREATE INDEX sandboxes_host_id ON sandboxes (host_id)",
    ),
    // The purge of ended SSH sessions (ssh_sessions.rs) searches these
    // instead of reading every session: the revoked ones, and those with an
    // expiry by it. Partial, so sessions that are live and never expire
    // stay out of both.
    (
        5,
        "CREATE INDEX ssh_sessions_revoked ON ssh_sessions (revoked) WHERE revoked > 0;
    CREATE INDEX ssh_sessions_expiring ON ssh_sessions (expires_ms) WHERE expires_ms > 0",
        "CREATE INDEX ssh_sessions_revoked ON ssh_sessions (revoked) WHERE revoked > 0;
    CREATE INDEX ssh_sessions_expiring ON ssh_sessions (expires_ms) WHERE expires_ms > 0",
    ),
    // The event log behind WatchSandbox cursors and sandbox logs
    // (events.rs): each row's `kind` ('status', 'log', 'deleted') and
    // `record` (the prost-encoded `Sandbox` after a status change, or the
    // `SandboxLogLine`); `event_floors` holds, per sandbox, the newest seq
    // of each kind trimmed away, so a cursor older than that is known to
    // have missed something. `config_counters.event_space` names this
    // store's sequence space in cursors.
    (
        6,
        "ALTER TABLE sandbox_events ADD COLUMN kind TEXT NOT NULL DEFAULT 'status';
    ALTER TABLE sandbox_events ADD COLUMN record BLOB;
    CREATE INDEX sandbox_events_by_sandbox ON sandbox_events (sandbox_id, kind, seq);
    CREATE TABLE event_floors (
        sandbox_id TEXT PRIMARY KEY,
        status_floor INTEGER NOT NULL DEFAULT 0,
        log_floor INTEGER NOT NULL DEFAULT 0
    )",
        "ALTER TABLE sandbox_events ADD COLUMN kind TEXT NOT NULL DEFAULT 'status';
    ALTER TABLE sandbox_events ADD COLUMN record BYTEA;
    CREATE INDEX sandbox_events_by_sandbox ON sandbox_events (sandbox_id, kind, seq);
    CREATE TABLE event_floors (
        sandbox_id TEXT PRIMARY KEY,
        status_floor BIGINT NOT NULL DEFAULT 0,
        log_floor BIGINT NOT NULL DEFAULT 0
    )",
    ),
    // The last pushed log message recorded per sandbox (events.rs
    // `append_logs`): a retried push is not recorded twice.
    (
        7,
        "ALTER TABLE event_floors ADD COLUMN push_pusher TEXT NOT NULL DEFAULT '';
    ALTER TABLE event_floors ADD COLUMN push_sequence INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE event_floors ADD COLUMN push_pusher TEXT NOT NULL DEFAULT '';
    ALTER TABLE event_floors ADD COLUMN push_sequence BIGINT NOT NULL DEFAULT 0",
    ),
    // The connection attempt of the session that holds each host's seat
    // (hosts.rs `hold_host`): an older attempt of the same host instance
    // arriving late never takes the seat from a newer one.
    (
        9,
        "ALTER TABLE hosts ADD COLUMN connection_epoch INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE hosts ADD COLUMN connection_epoch BIGINT NOT NULL DEFAULT 0",
    ),
];
