-- Portable DDL: runs unchanged on SQLite and PostgreSQL (TEXT and BIGINT
-- only, no autoincrement, no booleans, no dialect functions). Times are Unix
-- epoch milliseconds.

CREATE TABLE workspaces (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

INSERT INTO workspaces (id, name, created_at) VALUES ('default', 'Default', 0);

-- One row per dispatch to the runner. `id` is the session id. `env_json` and
-- `config_json` are what the /env and /config callbacks return.
CREATE TABLE runs (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces (id),
    kind           TEXT NOT NULL,
    chat_id        TEXT,
    status         TEXT NOT NULL,
    prompt         TEXT NOT NULL,
    model          TEXT NOT NULL,
    env_json       TEXT NOT NULL,
    config_json    TEXT NOT NULL,
    result         TEXT,
    error_code     TEXT,
    error_message  TEXT,
    created_at     BIGINT NOT NULL,
    ended_at       BIGINT
);

CREATE INDEX runs_workspace ON runs (workspace_id, created_at);

-- One-time callback tokens. Only the SHA-256 of a token is stored.
CREATE TABLE tokens (
    hash        TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    session_id  TEXT NOT NULL REFERENCES runs (id),
    expires_at  BIGINT NOT NULL,
    used_at     BIGINT,
    created_at  BIGINT NOT NULL
);

CREATE INDEX tokens_session ON tokens (session_id);

-- Files: written back by runs, or uploaded to a chat's bag. The bytes live in
-- the blob folder under their SHA-256.
CREATE TABLE files (
    id            TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    run_id        TEXT,
    chat_id       TEXT,
    origin        TEXT NOT NULL,
    path          TEXT NOT NULL,
    mime_type     TEXT NOT NULL,
    size          BIGINT NOT NULL,
    sha256        TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    deleted_at    BIGINT
);

CREATE INDEX files_run ON files (run_id);
CREATE INDEX files_chat ON files (chat_id);
