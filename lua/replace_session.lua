-- replace_session: replace a session record in one step (DEL + HSET), so no reader ever finds it missing.
-- A DEL followed by a separate HSET left no record at all when the node died in between (SIGKILL during a
-- CONNECT); the next node then answered a resuming client with session present = 0.
-- KEYS[1] = <prefix>{client}_session   ARGV = field1, value1, field2, value2, ...
-- Returns the number of fields written.
redis.call('DEL', KEYS[1])
return redis.call('HSET', KEYS[1], unpack(ARGV))
