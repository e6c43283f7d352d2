-- Freeing the file bag's bytes (`files::blobs`). Portable DDL, as in 0001.

-- A blob is freed when no live file row refers to it: the rows are counted
-- when freeing, by their SHA-256.
CREATE INDEX files_sha256 ON files (sha256, deleted_at);

-- An upload's pin on a blob, from before its bytes are in place until its
-- file row is stored: freeing skips a pinned blob. `created_at` (epoch ms)
-- lets a pin a crashed upload left expire (after an hour).
CREATE TABLE blob_pins (
    id          TEXT PRIMARY KEY,
    sha256      TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE INDEX blob_pins_sha256 ON blob_pins (sha256, created_at);
