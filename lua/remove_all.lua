-- remove all: clean start on an existing session, or the session expired.
-- KEYS[1] = <prefix>{client}_messages   KEYS[2] = <prefix>{client}_last_packet_id
-- KEYS[3] (optional) = <prefix>{client}_sent   KEYS[4] (optional) = <prefix>{client}_session
-- Deletes every payload, the ZSET and the last packet id (the next session starts at packet id 1), and the
-- session record's "score" (the highest score given, save.lua), so scores restart with the queue.
-- Returns the number of messages removed.
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, member in ipairs(members) do
  redis.call('DEL', member)
end
redis.call('DEL', KEYS[1], KEYS[2])
if KEYS[3] then redis.call('DEL', KEYS[3]) end
if KEYS[4] then redis.call('HDEL', KEYS[4], 'score') end
return #members
