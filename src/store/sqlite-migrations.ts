/**
 * Versioned schema of the SQLite store. Append new versions; never edit an applied one.
 * JSON values are stored as TEXT; times as ISO-8601 strings (they sort as text).
 */
export const sqliteMigrations: Array<{ version: number; name: string; sql: string }> = [
  {
    version: 1,
    name: 'initial schema',
    sql: `
      CREATE TABLE sessions (
        id           TEXT PRIMARY KEY,
        tenant       TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        updated_at   TEXT NOT NULL,
        status       TEXT NOT NULL,
        model        TEXT NOT NULL,
        instructions TEXT,
        tools        TEXT,
        approval     TEXT NOT NULL,
        limits       TEXT NOT NULL,
        metadata     TEXT NOT NULL,
        last_seq     INTEGER NOT NULL DEFAULT 0,
        input_tokens  INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        total_tokens  INTEGER NOT NULL DEFAULT 0,
        forked_from  TEXT
      );
      CREATE INDEX sessions_tenant_id ON sessions (tenant, id);

      CREATE TABLE messages (
        pos          INTEGER PRIMARY KEY AUTOINCREMENT,
        id           TEXT NOT NULL UNIQUE,
        session_id   TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        run_id       TEXT,
        role         TEXT NOT NULL,
        content      TEXT,
        tool_calls   TEXT,
        tool_call_id TEXT,
        at_seq       INTEGER NOT NULL,
        created_at   TEXT NOT NULL
      );
      CREATE INDEX messages_session ON messages (session_id, pos);

      CREATE TABLE runs (
        id          TEXT PRIMARY KEY,
        session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        status      TEXT NOT NULL,
        request_id  TEXT NOT NULL,
        steps       INTEGER NOT NULL DEFAULT 0,
        usage       TEXT NOT NULL,
        error       TEXT,
        message_id  TEXT NOT NULL,
        input       TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        started_at  TEXT,
        ended_at    TEXT
      );
      CREATE INDEX runs_session ON runs (session_id, id);
      CREATE INDEX runs_unfinished ON runs (status) WHERE status NOT IN ('completed', 'failed', 'cancelled');

      CREATE TABLE tool_calls (
        id          TEXT NOT NULL,
        session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        run_id      TEXT NOT NULL,
        step        INTEGER NOT NULL,
        name        TEXT NOT NULL,
        input       TEXT,
        state       TEXT NOT NULL,
        started_at  TEXT NOT NULL,
        ended_at    TEXT,
        duration_ms INTEGER,
        result      TEXT,
        error       TEXT,
        PRIMARY KEY (session_id, id)
      );
      CREATE INDEX tool_calls_run ON tool_calls (run_id);

      CREATE TABLE events (
        session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq         INTEGER NOT NULL,
        run_id      TEXT,
        channel     TEXT NOT NULL,
        type        TEXT NOT NULL,
        at          TEXT NOT NULL,
        request_id  TEXT,
        data        TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
      ) WITHOUT ROWID;

      CREATE TABLE idempotency (
        tenant      TEXT NOT NULL,
        key         TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        state       TEXT NOT NULL,
        status      INTEGER,
        body        TEXT,
        created_at  TEXT NOT NULL,
        PRIMARY KEY (tenant, key)
      );
      CREATE INDEX idempotency_created ON idempotency (created_at);
    `
  },
  {
    version: 2,
    name: 'per-tenant session counts',
    // countSessions runs on every POST /v1/sessions; count(*) over a tenant's sessions grows
    // with them (5 ms at 100 000), a counter kept by triggers does not.
    sql: `
      CREATE TABLE tenant_stats (
        tenant   TEXT PRIMARY KEY,
        sessions INTEGER NOT NULL
      );
      INSERT INTO tenant_stats (tenant, sessions) SELECT tenant, count(*) FROM sessions GROUP BY tenant;
      CREATE TRIGGER sessions_counted AFTER INSERT ON sessions BEGIN
        INSERT INTO tenant_stats (tenant, sessions) VALUES (NEW.tenant, 1)
          ON CONFLICT (tenant) DO UPDATE SET sessions = sessions + 1;
      END;
      CREATE TRIGGER sessions_uncounted AFTER DELETE ON sessions BEGIN
        UPDATE tenant_stats SET sessions = sessions - 1 WHERE tenant = OLD.tenant;
      END;
    `
  },
  {
    version: 3,
    name: 'idempotency claims with a lease',
    // A claim in progress holds only until lease_until; claims from before this version have none
    // and are treated as expired (their holder was a process that is gone).
    sql: `
      ALTER TABLE idempotency ADD COLUMN lease_until TEXT;
      UPDATE idempotency SET lease_until = created_at;
    `
  },
  {
    version: 4,
    name: 'summary messages',
    // A summary message stands for the first N messages of its session when the model is called (SPEC 12).
    sql: 'ALTER TABLE messages ADD COLUMN replaces_messages INTEGER;'
  },
  {
    version: 5,
    name: 'newest seq from the events',
    // A session's newest seq is its newest event's (the events' primary key finds it in one
    // descent): keeping it in the sessions row wrote that row in every transaction with events.
    sql: 'ALTER TABLE sessions DROP COLUMN last_seq;'
  },
  {
    version: 6,
    name: 'summaries found by index',
    // A run reads its history from the newest summary on (listContextMessages): found here
    // without reading the messages before it.
    sql: `CREATE INDEX messages_summaries ON messages (session_id, pos) WHERE role = 'summary';`
  },
  {
    version: 7,
    name: 'sessions not whole',
    // A session being deleted, or made by a fork still copying: both go a piece per write
    // (deleteSession, forkSession). Listed here from their first write to their last, such a
    // session is left out of every listing, and one a stop cut short is removed at the next start.
    sql: `CREATE TABLE unfinished_sessions (
      session_id TEXT PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE
    ) WITHOUT ROWID;`
  },
  {
    version: 8,
    name: 'token totals within 2^53',
    // Totals are summed up to MOST_TOKENS (2^53 - 1) from now on. One summed past it before could
    // not be read back (node:sqlite refuses it): every read of its session failed.
    sql: `UPDATE sessions SET input_tokens = min(input_tokens, 9007199254740991), output_tokens = min(output_tokens, 9007199254740991),
        total_tokens = min(total_tokens, 9007199254740991)
      WHERE max(input_tokens, output_tokens, total_tokens) > 9007199254740991;`
  },
  {
    version: 9,
    name: 'a run keeps the traceparent it was submitted with',
    // Whichever process starts a queued run continues its request's trace (RunRecord.traceparent).
    sql: 'ALTER TABLE runs ADD COLUMN traceparent TEXT;'
  }
]
