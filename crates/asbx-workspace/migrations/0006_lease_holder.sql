-- Who drives a chat's turn when it is not the node that started it
-- (docs/protocol.md §9): NULL while the dispatching node holds the lease;
-- the id of the node that took the turn over after the lease expired. A
-- lease is renewed only by its holder, so a node that was cut off and comes
-- back can't go on driving a turn another node took over.
ALTER TABLE chats ADD COLUMN lease_holder TEXT;
