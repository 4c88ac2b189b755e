-- read backlog: the client's stored messages in score order, from a cursor.
-- KEYS[1] = <prefix>{client}_messages
-- KEYS[2] = <prefix>{client}_sent (HASH payload key -> "<score> <connection id>": the score it had when a
--           connection read it to send it, and that connection)
-- ARGV[1] = exclusive lower score bound ('-inf' for everything)   ARGV[2] = max entries (0 = all)
-- ARGV[3] = 1: record the returned entries as sent (the caller sends them next), 0: only read
-- ARGV[4] (optional) = the reading connection's id.  A mark this same connection left is not "sent before":
--           the read that left it may have lost its reply (a timeout while the broker was cut off from Redis),
--           so nothing went out, and the connection sends each entry once anyway (it skips what it has in
--           flight).  Only a mark of another connection -- an earlier one of the session -- means a resend.
-- A member whose payload key is gone (expired or trimmed) is removed from the ZSET and skipped.
-- Returns a flat array {score, payload JSON, sent before (0/1), ...}; "sent before" drives the DUP flag.
local zset, sent = KEYS[1], KEYS[2]
local low = ARGV[1]
if low ~= '-inf' then low = '(' .. low end
local limit = tonumber(ARGV[2] or '0')
local mark = ARGV[3] == '1'
local reader = ARGV[4] or ''
local mark_value = function(score) if reader == '' then return score end return score .. ' ' .. reader end
local entries
if limit > 0 then
  entries = redis.call('ZRANGEBYSCORE', zset, low, '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
else
  entries = redis.call('ZRANGEBYSCORE', zset, low, '+inf', 'WITHSCORES')
end
local out = {}
for i = 1, #entries, 2 do
  local member, score = entries[i], entries[i + 1]
  local payload = redis.call('GET', member)
  if payload then
    -- a packet id is reused after wraparound: only the same member with the same score was sent before
    local was_sent = 0
    if sent then
      local seen = redis.call('HGET', sent, member)
      if seen then
        local seen_score, seen_by = string.match(seen, '^(%S+) ?(%S*)$')
        if seen_score == score and (reader == '' or seen_by ~= reader) then was_sent = 1 end
      end
      if mark then redis.call('HSET', sent, member, mark_value(score)) end
    end
    out[#out + 1] = score
    out[#out + 1] = payload
    out[#out + 1] = was_sent
  else
    redis.call('ZREM', zset, member)
    if sent then redis.call('HDEL', sent, member) end
  end
end
return out
