-- Kept working directories (CONTRACT §11), continued from 0015. Portable
-- DDL, as in 0001.

-- A run of `POST /api/runs` that starts from a chat's kept directory
-- (`"workdir": {"from": chatId}`): that chat, whose blobs its runner may
-- read (it captures nothing back).
ALTER TABLE runs ADD COLUMN workdir_from TEXT;

-- When a snapshot stopped being restorable: past its chat's
-- `ASBX_WORKDIR_KEEP_TURNS` latest, its `workdir_blobs` rows are removed
-- (so gc can free the bytes) and this is set; its manifest stays.
ALTER TABLE workdir_snapshots ADD COLUMN released_at BIGINT;
UPDATE workdir_snapshots SET released_at = created_at
    WHERE status = 'ok' AND bytes > 0
    AND NOT EXISTS (SELECT 1 FROM workdir_blobs b WHERE b.snapshot_id = workdir_snapshots.id);

-- Each blob's size, so a workspace's `storage-mb` counts the distinct
-- bytes its kept directories hold. Rows from before this migration get
-- the size the database's blob store knows (0 for a blob in a node's
-- folder: such a row counts nothing until it is retired).
ALTER TABLE workdir_blobs ADD COLUMN size BIGINT NOT NULL DEFAULT 0;
UPDATE workdir_blobs SET size = COALESCE(
    (SELECT b.size FROM blobs b WHERE b.sha256 = workdir_blobs.sha256), 0);

CREATE INDEX workdir_snapshots_workspace ON workdir_snapshots (workspace_id);
