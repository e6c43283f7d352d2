-- A redeemed callback's retry (docs/protocol.md §3). Portable DDL, as in 0001.

-- One row per one-time token redeemed with a request id (the gateway's
-- `x-asbx-request-id`), written in the redemption's transaction: the same
-- token with the same request id is answered once more until `expires_at`
-- (epoch ms, the redemption + 2 min), on any node, and the row is taken.
-- `request_hash` is the SHA-256 (hex) of the request id. `answer` is what
-- answering again needs beyond the run's stored data, never a secret: for
-- `/env` the hash of the workspace bearer the lost answer carried (revoked
-- when the retry is answered with a fresh one), for `/results` the stored
-- files (`{"files": [{"path", "id"}]}`), for `/config` nothing (`{}`).
CREATE TABLE callback_replays (
    token_hash    TEXT PRIMARY KEY,
    request_hash  TEXT NOT NULL,
    answer        TEXT NOT NULL,
    expires_at    BIGINT NOT NULL,
    created_at    BIGINT NOT NULL
);

CREATE INDEX callback_replays_expiry ON callback_replays (expires_at);
