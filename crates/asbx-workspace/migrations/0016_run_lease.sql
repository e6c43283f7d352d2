-- The relay lease of an API run or an agent run (docs/protocol.md §9), as a
-- chat's lease is for its turns: `lease_holder` is the node relaying the
-- run, `lease_expires_at` (epoch ms) when another node may take it over
-- (renewed every quarter of the lease's lifetime while the relay reads).
-- NULL: nobody holds it (chat turns, settled runs, runs stored before it).
ALTER TABLE runs ADD COLUMN lease_holder TEXT;
ALTER TABLE runs ADD COLUMN lease_expires_at BIGINT;

CREATE INDEX runs_lease ON runs (status, lease_expires_at);
