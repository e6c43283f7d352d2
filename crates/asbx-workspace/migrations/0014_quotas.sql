-- Quotas per workspace (CONTRACT.md §10, `quota`). Portable DDL, as in 0001.

-- The operator's overrides (`asbx quota set`): one row per workspace and
-- quota name; `value` NULL means unlimited. A quota without a row takes
-- the server's default (`ASBX_QUOTA_*`).
CREATE TABLE workspace_quotas (
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    name          TEXT NOT NULL,
    value         BIGINT,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (workspace_id, name)
);

-- `requests-per-minute`: one row per API key or browser session (its
-- hash, or `anon:<workspace>`) and minute (epoch ms of its start), counted
-- by one conditional upsert; rows of past minutes are deleted.
CREATE TABLE rate_windows (
    subject       TEXT NOT NULL,
    window_start  BIGINT NOT NULL,
    hits          BIGINT NOT NULL,
    PRIMARY KEY (subject, window_start)
);

-- A run's model tokens (input + output, from its `session_ended` stats),
-- written when it settles: `tokens-per-day` sums them.
ALTER TABLE runs ADD COLUMN tokens BIGINT NOT NULL DEFAULT 0;

-- `concurrent-sandboxes` counts a workspace's running runs;
-- `sandbox-seconds-per-day` reads the ones that ran today.
CREATE INDEX runs_workspace_status ON runs (workspace_id, status);
CREATE INDEX runs_workspace_ended ON runs (workspace_id, ended_at);
