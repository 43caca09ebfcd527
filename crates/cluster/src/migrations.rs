//! Versioned schema. A migration is applied once, in order, under a transaction-scoped
//! advisory lock so that gateways starting together do not race; `gw_schema_version` says
//! which ran. Never edit a shipped migration: append a new one.

/// `(version, SQL)`, ascending.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (1, V1_LEASE),
    (2, V2_JOURNAL),
    (3, V3_CREDENTIAL_LEASE),
    (4, V4_GATEWAY_JOURNAL),
    (5, V5_TRACE),
    (6, V6_USAGE),
    (7, V7_ACCESS),
];

/// The lease, its grant history, the fenced event log (a copy of the lifecycle ledger), and
/// the fence itself.
const V1_LEASE: &str = r#"
CREATE TABLE gw_lease (
    name        text PRIMARY KEY,
    epoch       bigint NOT NULL DEFAULT 0,
    holder_id   text,
    holder      jsonb,
    acquired_at timestamptz,
    renewed_at  timestamptz,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity'
);
-- One row per grant: the primary key makes "at most one holder per epoch" a constraint.
CREATE TABLE gw_lease_history (
    name       text NOT NULL,
    epoch      bigint NOT NULL,
    holder_id  text NOT NULL,
    holder     jsonb NOT NULL,
    granted_at timestamptz NOT NULL,
    PRIMARY KEY (name, epoch)
);
CREATE TABLE gw_events (
    id        bigserial PRIMARY KEY,
    name      text NOT NULL,
    epoch     bigint NOT NULL,
    holder_id text NOT NULL,
    event     text NOT NULL,
    detail    jsonb NOT NULL DEFAULT '{}',
    at        timestamptz NOT NULL
);
-- The fence: called first in every write of an active. FOR SHARE makes a concurrent grant
-- (an UPDATE of the row) wait for the write to commit, so no write of epoch N can commit
-- after epoch N+1 was granted.
CREATE FUNCTION gw_fence(p_name text, p_epoch bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    cur  bigint;
    live boolean;
BEGIN
    SELECT epoch, expires_at > clock_timestamp() INTO cur, live
      FROM gw_lease WHERE name = p_name FOR SHARE;
    IF cur IS DISTINCT FROM p_epoch OR NOT live THEN
        RAISE EXCEPTION 'epoch % is not the live lease of % (current epoch %, live %)',
            p_epoch, p_name, cur, live USING ERRCODE = 'GW001';
    END IF;
END $$;
"#;

/// The shared message journal (journal.rs): the rows crates/journal/src/sqlite.rs keeps in
/// SQLite, per cluster, with the epoch of the last write.
const V2_JOURNAL: &str = r#"
CREATE TABLE gw_messages (
    name        text NOT NULL,
    id          text NOT NULL,
    chat_id     text NOT NULL,
    user_id     text NOT NULL,
    text        text NOT NULL,
    state       text NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
    reply       text,
    reason      text,
    attempts    integer NOT NULL DEFAULT 0,
    incarnation text,
    epoch       bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (name, id)
);
CREATE INDEX gw_messages_pending ON gw_messages (name, created_at) WHERE state IN ('queued', 'running');
"#;

/// Credential leases (credlease.rs): one row per `(platform, sha256(credential))`, held by one
/// gateway of one cluster at a time, expiring like the cluster lease. Keyed by the hash, never
/// the secret.
const V3_CREDENTIAL_LEASE: &str = r#"
CREATE TABLE gw_credential_lease (
    platform    text NOT NULL,
    credential  text NOT NULL,
    cluster     text NOT NULL,
    holder_id   text NOT NULL,
    holder      jsonb NOT NULL,
    epoch       bigint NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (platform, credential)
);
"#;

/// Everything else the gateway's journal holds (crates/journal/src/sqlite.rs schema 2), so that
/// the runtime can run on PostgreSQL: where an inbound message came from and its platform event
/// id (deduplication across every gateway of the cluster), command rows, the durable outbox,
/// and per-chat sessions. `seq` orders rows accepted in the same microsecond (SQLite's rowid);
/// `finishes` counts the running → done/failed transitions, so "finished exactly once" can be
/// checked from the database itself.
const V4_GATEWAY_JOURNAL: &str = r#"
ALTER TABLE gw_messages
    ADD COLUMN seq        bigserial,
    ADD COLUMN kind       text NOT NULL DEFAULT 'async' CHECK (kind IN ('sync', 'async')),
    ADD COLUMN is_command boolean NOT NULL DEFAULT false,
    ADD COLUMN platform   text,
    ADD COLUMN event_id   text,
    ADD COLUMN finishes   integer NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX gw_messages_event ON gw_messages (name, platform, event_id) WHERE event_id IS NOT NULL;
CREATE INDEX gw_messages_chat ON gw_messages (name, platform, chat_id, created_at);
CREATE INDEX gw_messages_finished ON gw_messages (name, updated_at) WHERE state IN ('done', 'failed');
CREATE INDEX gw_messages_state ON gw_messages (name, state);
CREATE TABLE gw_outbox (
    seq        bigserial PRIMARY KEY,
    name       text NOT NULL,
    platform   text NOT NULL,
    chat_id    text NOT NULL,
    text       text NOT NULL,
    message_id text,
    state      text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'failed')),
    reason     text,
    epoch      bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX gw_outbox_pending ON gw_outbox (name, platform, state, seq);
CREATE TABLE gw_sessions (
    name       text NOT NULL,
    platform   text NOT NULL,
    chat_id    text NOT NULL,
    started_at timestamptz NOT NULL,
    epoch      bigint NOT NULL,
    PRIMARY KEY (name, platform, chat_id)
);
"#;

/// Every message's trace (crates/journal/src/trace.rs; the SQLite journal's `trace` table),
/// written by the statements that already change the message (journal.rs), and deleted with
/// the message by a trigger, whoever deletes it: the table is bounded by the messages'
/// retention. An older gatewarden ignores it (it runs only the migrations it knows).
const V5_TRACE: &str = r#"
CREATE TABLE gw_trace (
    seq        bigserial PRIMARY KEY,
    name       text NOT NULL,
    message_id text NOT NULL,
    step       text NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    subject    text,
    outcome    text,
    elapsed_ms bigint
);
CREATE INDEX gw_trace_message ON gw_trace (name, message_id, seq);
CREATE FUNCTION gw_trace_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM gw_trace WHERE name = OLD.name AND message_id = OLD.id;
    RETURN OLD;
END $$;
CREATE TRIGGER gw_trace_pruned AFTER DELETE ON gw_messages
    FOR EACH ROW EXECUTE FUNCTION gw_trace_pruned();
"#;

/// A run's `(prompt, completion)` tokens when the upstream reports them (issue 17: usage in the
/// journal), as the SQLite journal's `messages` columns of the same names. Nullable: an older
/// gatewarden writes none, and reads no further than its own columns.
const V6_USAGE: &str = r#"
ALTER TABLE gw_messages ADD COLUMN prompt_tokens bigint, ADD COLUMN completion_tokens bigint;
"#;

/// The access policy's pairing book (crates/runtime/src/access/pairing.rs), one document per
/// cluster: what one home keeps in `pairing.json`, here so that a standby promoted on another
/// host decides as the old active did. Written by the active only, fenced.
const V7_ACCESS: &str = r#"
CREATE TABLE gw_access (
    name       text PRIMARY KEY,
    doc        text NOT NULL,
    epoch      bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"#;

/// The SQLSTATE `gw_fence` raises.
pub const FENCED_SQLSTATE: &str = "GW001";
