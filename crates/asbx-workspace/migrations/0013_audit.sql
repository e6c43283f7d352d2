-- The audit log (docs/api-audit.md, CONTRACT §10). Portable DDL, as in 0001.

-- One row per workspace with a chain: the last record's id and hash, and
-- the anchor left by retention (the id and hash of the last record pruned;
-- 0 and '' before any). An append locks this row in its transaction (an
-- UPDATE), so writers on any node take turns and the chain stays one.
CREATE TABLE audit_heads (
    workspace_id  TEXT PRIMARY KEY,
    last_id       BIGINT NOT NULL,
    last_hash     TEXT NOT NULL,
    anchor_id     BIGINT NOT NULL,
    anchor_hash   TEXT NOT NULL
);

-- One row per record: `id` counts from 1 per workspace, `record` is the
-- record's canonical JSON (with its `prevHash` and `hash`), `run_id` and
-- `ts` (epoch ms) are copies for the queries.
CREATE TABLE audit_records (
    workspace_id  TEXT NOT NULL,
    id            BIGINT NOT NULL,
    run_id        TEXT,
    ts            BIGINT NOT NULL,
    record        TEXT NOT NULL,
    PRIMARY KEY (workspace_id, id)
);

CREATE INDEX audit_records_run ON audit_records (run_id, id);
CREATE INDEX audit_records_ts ON audit_records (workspace_id, ts);

-- The runner's audit token of a dispatch (sent to the operator's runners
-- only, in a header, never to the sandbox): the SHA-256 (hex) of the
-- token, valid until `expires_at` (epoch ms: the run's cap and a grace,
-- so the runner's last report after the end still counts).
CREATE TABLE audit_tokens (
    run_id      TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL,
    expires_at  BIGINT NOT NULL
);
