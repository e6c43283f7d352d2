-- The file bag's bytes in the database (`ASBX_BLOB_STORE=db`, the default
-- on PostgreSQL), so every workspace node serves every file. Portable DDL,
-- as in 0001, with one exception: `BYTEA`, which PostgreSQL knows and
-- SQLite stores as it stores any value (a column of unknown type keeps a
-- blob a blob).

-- One row per blob, under its SHA-256 (hex), written once `complete` = 1
-- with all its chunks. An upload in progress is a row `complete` = 0 under
-- a temporary name (`upload-<random>`, never 64 hex digits) holding the
-- chunks written so far; publishing it moves them under the final hash in
-- one transaction. `created_at` lets a node remove uploads that a crashed
-- node left half-written.
CREATE TABLE blobs (
    sha256      TEXT PRIMARY KEY,
    size        BIGINT NOT NULL,
    complete    BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);

-- A blob's bytes in 1 MiB chunks (the last one shorter), `idx` from 0; an
-- empty blob has none.
CREATE TABLE blob_chunks (
    sha256  TEXT NOT NULL REFERENCES blobs (sha256),
    idx     BIGINT NOT NULL,
    data    BYTEA NOT NULL,
    PRIMARY KEY (sha256, idx)
);

CREATE INDEX blobs_incomplete ON blobs (complete, created_at);
