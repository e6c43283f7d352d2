-- Stored agents (the Agents block of a workflow) and the link from a run to
-- the agent it ran. Portable DDL, as in 0001.

-- An agent. `definition` is the JSON body it was created or last updated
-- with (system prompt, model, skills, MCP servers, named environment,
-- limits). A deleted agent keeps its row (its runs still name it) but is
-- never found again.
CREATE TABLE agents (
    id            TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    name          TEXT NOT NULL,
    definition    TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    deleted_at    BIGINT
);

CREATE INDEX agents_workspace ON agents (workspace_id, created_at);

ALTER TABLE runs ADD COLUMN agent_id TEXT;
