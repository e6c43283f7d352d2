-- Protocol 2 runs (docs/protocol.md §4 and §7). Portable DDL, as in 0001.

-- `termination`: the `session_ended` fields (JSON) once the run has ended,
-- absent for an encrypted run (they are ciphertext there).
-- `sandbox_url`: the runner the run was dispatched to, for its tool results
-- and cancellation.
-- `events_from`: the lowest `seq` still kept in `run_events`; a replay
-- asking for older lines gets `410`.
ALTER TABLE runs ADD COLUMN termination TEXT;
ALTER TABLE runs ADD COLUMN sandbox_url TEXT;
ALTER TABLE runs ADD COLUMN events_from BIGINT NOT NULL DEFAULT 0;

-- Every line of a run as the runner sent it (ciphertext stays ciphertext),
-- so any workspace node can replay a run. Only the newest lines of a run
-- are kept (see `runs::events`).
CREATE TABLE run_events (
    run_id  TEXT NOT NULL REFERENCES runs (id),
    seq     BIGINT NOT NULL,
    line    TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
