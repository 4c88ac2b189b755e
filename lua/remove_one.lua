-- remove one: the subscriber acknowledged a message (PUBACK, or PUBCOMP for QoS 2).
-- KEYS[1] = <prefix>{client}_messages   KEYS[2] (optional) = <prefix>{client}_sent
-- ARGV[1] = packet id
-- Harmless when already gone. Returns 1 if the reference was removed, else 0.
local member = KEYS[1] .. '_' .. ARGV[1]
redis.call('DEL', member)
if KEYS[2] then redis.call('HDEL', KEYS[2], member) end
return redis.call('ZREM', KEYS[1], member)
