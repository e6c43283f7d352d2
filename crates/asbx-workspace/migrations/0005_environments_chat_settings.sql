-- Named environments (what `/env` carries, stored once per workspace and
-- picked by name or id) and per-chat settings. Portable DDL, as in 0001.

-- `variables` and `secrets` are JSON objects, `allowed_hosts` a JSON array.
-- Secret values are write-only: no response carries them; they reach a
-- sandbox only through `/env`.
CREATE TABLE environments (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces (id),
    name           TEXT NOT NULL,
    variables      TEXT NOT NULL,
    secrets        TEXT NOT NULL,
    setup_script   TEXT,
    allowed_hosts  TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    deleted_at     BIGINT
);

-- Names are unique among a workspace's live environments (partial indexes
-- are portable between SQLite and PostgreSQL).
CREATE UNIQUE INDEX environments_live_name ON environments (workspace_id, name)
    WHERE deleted_at IS NULL;

-- A chat's settings (model, system prompt, environment, skills, MCP
-- servers) as a JSON object; NULL: the defaults.
ALTER TABLE chats ADD COLUMN settings TEXT;
