-- Chats, their messages (one row per message), workspace API keys and
-- browser sessions. Portable DDL, as in 0001.

-- A chat. `lease_turn_id` and `lease_expires_at` are the single-flight lock:
-- a turn holds the lease while it runs and renews it; a lease whose holder
-- died expires and can be taken over.
CREATE TABLE chats (
    id                TEXT PRIMARY KEY,
    workspace_id      TEXT NOT NULL REFERENCES workspaces (id),
    title             TEXT NOT NULL,
    conversation_id   TEXT,
    lease_turn_id     TEXT,
    lease_expires_at  BIGINT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    deleted_at        BIGINT
);

CREATE INDEX chats_workspace ON chats (workspace_id, updated_at);

-- One row per message, so appending stays cheap as a chat grows. `content`
-- and `attachments` are JSON arrays (content blocks, file attachments).
CREATE TABLE messages (
    id           TEXT PRIMARY KEY,
    chat_id      TEXT NOT NULL REFERENCES chats (id),
    position     BIGINT NOT NULL,
    role         TEXT NOT NULL,
    content      TEXT NOT NULL,
    attachments  TEXT NOT NULL,
    turn_id      TEXT,
    created_at   BIGINT NOT NULL,
    UNIQUE (chat_id, position)
);

-- Workspace API keys; only the SHA-256 of a key is stored.
CREATE TABLE api_keys (
    hash          TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    name          TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    revoked_at    BIGINT
);

-- Browser sessions made by signing in with a key; only the hash is stored.
CREATE TABLE web_sessions (
    hash          TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
);
