-- Secrets set at the egress proxy (docs/api-environments.md). Portable DDL,
-- as in 0001.

-- A named environment's secrets bound to hosts: JSON object, secret name
-- to {"hosts", "header", "format"}. Not secret (no value): the API answers
-- it. A bound secret's value stays sealed in `secrets`; its variable in the
-- sandbox holds the placeholder `asbx-secret:NAME`.
ALTER TABLE environments ADD COLUMN secret_inject TEXT NOT NULL DEFAULT '{}';
