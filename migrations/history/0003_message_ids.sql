-- A conversation resent whole by an AG-UI client is recognised message by message, by id.
CREATE INDEX messages_thread_message_idx ON messages (owner, thread_id, message_id);
