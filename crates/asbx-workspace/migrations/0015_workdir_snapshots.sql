-- A chat's working directory kept between turns (CONTRACT §11). One row
-- per turn that ended on its own (`id` is its run's id; a fork's copy gets
-- a fresh id): the manifest, or why the capture was refused. The bytes
-- are blobs (`files::blobs`), kept while a `workdir_blobs` row names them.
CREATE TABLE workdir_snapshots (
    id            TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    chat_id       TEXT NOT NULL,
    run_id        TEXT,
    status        TEXT NOT NULL,
    error         TEXT,
    manifest      TEXT,
    entries       BIGINT NOT NULL,
    bytes         BIGINT NOT NULL,
    created_at    BIGINT NOT NULL
);

CREATE INDEX workdir_snapshots_chat ON workdir_snapshots (chat_id, created_at);

-- The blobs a restorable snapshot names, one row per distinct hash. Rows of
-- snapshots past the chat's retention are removed (the manifest stays).
CREATE TABLE workdir_blobs (
    snapshot_id  TEXT NOT NULL,
    sha256       TEXT NOT NULL,
    PRIMARY KEY (snapshot_id, sha256)
);

CREATE INDEX workdir_blobs_sha ON workdir_blobs (sha256);

-- A fork's origin: the chat and the assistant message it was forked after.
ALTER TABLE chats ADD COLUMN forked_from TEXT;
ALTER TABLE chats ADD COLUMN forked_after TEXT;
