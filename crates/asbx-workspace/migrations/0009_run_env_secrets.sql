-- Secrets at rest (docs/secrets.md). Portable DDL, as in 0001.

-- The named environment's secrets a run's `/env` carries, by name only
-- (JSON: {"environmentId", "names"}); the values are read from the
-- environment, and opened, when `/env` is redeemed. NULL: none. Runs no
-- longer copy secret values into `env_json`.
ALTER TABLE runs ADD COLUMN env_secrets TEXT;
