/**
 * Versioned schema of the PostgreSQL store. Append new versions; never edit an applied one.
 * IDs that pages are ordered by (sessions, tool calls; time-ordered) compare byte by byte
 * (COLLATE "C"), as in SQLite, whatever the database's collation. Times are ISO-8601 text and JSON values are text, as in the SQLite store, so that both stores
 * give back byte-identical events; only leases use the database clock, since several machines
 * must agree on when a lease has expired: a run's (timestamptz), and an idempotency claim's
 * (written from the database's now as text, PostgresStore.claimIdempotency).
 */
export const postgresMigrations: Array<{ version: number; name: string; sql: string }> = [
  {
    version: 1,
    name: 'initial schema',
    sql: `
      CREATE TABLE sessions (
        id            text COLLATE "C" PRIMARY KEY,
        tenant        text NOT NULL,
        created_at    text NOT NULL,
        updated_at    text NOT NULL,
        status        text NOT NULL,
        model         text NOT NULL,
        instructions  text,
        tools         text,
        approval      text NOT NULL,
        limits        text NOT NULL,
        metadata      text NOT NULL,
        last_seq      integer NOT NULL DEFAULT 0,
        input_tokens  bigint NOT NULL DEFAULT 0,
        output_tokens bigint NOT NULL DEFAULT 0,
        total_tokens  bigint NOT NULL DEFAULT 0,
        forked_from   text
      );
      CREATE INDEX sessions_tenant_id ON sessions (tenant, id);

      -- countSessions runs on every POST /v1/sessions: a counter kept by triggers, not count(*).
      CREATE TABLE tenant_stats (
        tenant   text PRIMARY KEY,
        sessions bigint NOT NULL
      );
      CREATE FUNCTION sessions_count() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF TG_OP = 'INSERT' THEN
          INSERT INTO tenant_stats (tenant, sessions) VALUES (NEW.tenant, 1)
            ON CONFLICT (tenant) DO UPDATE SET sessions = tenant_stats.sessions + 1;
        ELSE
          UPDATE tenant_stats SET sessions = sessions - 1 WHERE tenant = OLD.tenant;
        END IF;
        RETURN NULL;
      END $$;
      CREATE TRIGGER sessions_counted AFTER INSERT OR DELETE ON sessions FOR EACH ROW EXECUTE FUNCTION sessions_count();

      CREATE TABLE messages (
        pos          bigserial PRIMARY KEY,
        id           text NOT NULL UNIQUE,
        session_id   text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        run_id       text,
        role         text NOT NULL,
        content      text,
        tool_calls   text,
        tool_call_id text,
        at_seq       integer NOT NULL,
        created_at   text NOT NULL,
        -- of a summary message: how many messages, from the first, it stands for (SPEC 12)
        replaces_messages integer
      );
      CREATE INDEX messages_session ON messages (session_id, pos);

      -- pos: the order runs were accepted in (FIFO queues). owner, lease_until and
      -- cancel_requested belong to the shared run coordinator.
      CREATE TABLE runs (
        pos              bigserial NOT NULL UNIQUE,
        id               text PRIMARY KEY,
        session_id       text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        tenant           text,
        status           text NOT NULL,
        request_id       text NOT NULL,
        steps            integer NOT NULL DEFAULT 0,
        usage            text NOT NULL,
        error            text,
        message_id       text NOT NULL,
        input            text NOT NULL,
        created_at       text NOT NULL,
        started_at       text,
        ended_at         text,
        owner            text,
        lease_until      timestamptz,
        cancel_requested boolean NOT NULL DEFAULT false
      );
      CREATE INDEX runs_session ON runs (session_id, pos);
      CREATE INDEX runs_unfinished ON runs (pos) WHERE status NOT IN ('completed', 'failed', 'cancelled');
      CREATE INDEX runs_tenant_unfinished ON runs (tenant) WHERE status NOT IN ('completed', 'failed', 'cancelled');

      CREATE TABLE tool_calls (
        id          text COLLATE "C" NOT NULL,
        session_id  text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        run_id      text NOT NULL,
        step        integer NOT NULL,
        name        text NOT NULL,
        input       text,
        state       text NOT NULL,
        started_at  text NOT NULL,
        ended_at    text,
        duration_ms integer,
        result      text,
        error       text,
        PRIMARY KEY (session_id, id)
      );
      CREATE INDEX tool_calls_run ON tool_calls (run_id);

      CREATE TABLE events (
        session_id  text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
        seq         integer NOT NULL,
        run_id      text,
        channel     text NOT NULL,
        type        text NOT NULL,
        at          text NOT NULL,
        request_id  text,
        data        text NOT NULL,
        PRIMARY KEY (session_id, seq)
      );

      CREATE TABLE idempotency (
        tenant      text NOT NULL,
        key         text NOT NULL,
        fingerprint text NOT NULL,
        state       text NOT NULL,
        status      integer,
        body        text,
        created_at  text NOT NULL,
        lease_until text NOT NULL,
        PRIMARY KEY (tenant, key)
      );
      CREATE INDEX idempotency_created ON idempotency (created_at);

      -- Messages between processes too large for a NOTIFY payload (8000 bytes): the
      -- notification carries the row's id instead. Rows are deleted after a minute.
      CREATE TABLE cluster_messages (
        id      bigserial PRIMARY KEY,
        payload text NOT NULL,
        sent_at timestamptz NOT NULL DEFAULT now()
      );
    `
  },
  {
    version: 2,
    name: 'summaries found by index',
    // A run reads its history from the newest summary on (listContextMessages): found here
    // without reading the messages before it. Built once at the upgrade, holding writes to
    // messages meanwhile: ~0.15 s per million messages (measured on the test machine).
    sql: `CREATE INDEX messages_summaries ON messages (session_id, pos) WHERE role = 'summary';`
  },
  {
    version: 3,
    name: 'a tenant\'s active runs counted under its lock',
    // An admission counts the tenant's runs once it holds the tenant's lock, in one round trip:
    // a VOLATILE function's queries each take a snapshot of their own, so the count sees every
    // admission that held the lock before (PostgresRunCoordinator.admit).
    sql: `CREATE FUNCTION agentd_tenant_runs(of_tenant text) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
      BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('agentd-tenant:' || of_tenant));
        RETURN (SELECT count(*) FROM runs WHERE tenant = of_tenant AND status NOT IN ('completed', 'failed', 'cancelled'));
      END
    $$;`
  },
  {
    version: 4,
    name: 'tool call durations past 2^31 ms',
    // A call that waits for a person's approval or a client's result has no time limit: after
    // 24.8 days its duration no longer fit an integer, the call's final state was refused, and its
    // run could never end (SQLite keeps any such number). Rewrites the table and its indexes once,
    // holding its reads and writes meanwhile: ~6 s per million calls with 300-byte results
    // (measured on the test machine); longer results take longer.
    sql: 'ALTER TABLE tool_calls ALTER COLUMN duration_ms TYPE bigint;'
  },
  {
    version: 5,
    name: 'a run keeps the traceparent it was submitted with',
    // A queued run accepted by one process and started by another continues its request's trace
    // there (RunRecord.traceparent); the accepting process kept it in memory, where the other
    // could not see it, and held it for good. Adding a nullable column rewrites nothing.
    sql: 'ALTER TABLE runs ADD COLUMN traceparent text;'
  }
]
