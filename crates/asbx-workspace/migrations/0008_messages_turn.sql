-- Lookups that must not grow with a chat or with the workspace:
-- a turn's messages by turn id (the exactly-once guard on a turn's
-- assistant message, NOT EXISTS ... turn_id, and a turn's message ids), and
-- a chat's newest run (read when a chat is shown and a turn starts),
-- instead of every message of the chat and every run of the database.
-- asbx-bench chat-append measures appending at 100,000 messages.
CREATE INDEX messages_turn ON messages (chat_id, turn_id);
CREATE INDEX runs_chat ON runs (chat_id, created_at);
