-- save: store one client's batch of messages (one call per client per poll).
-- KEYS[1] = <prefix>{client}_messages          ZSET: member = payload key, score = never-wrapping counter
-- KEYS[2] = <prefix>{client}_last_packet_id    STRING: last packet id handed out (no TTL)
-- KEYS[3] (optional) = <prefix>{client}_sent    HASH: sent markers; a trimmed message's marker goes too
-- KEYS[4] (optional) = <prefix>{client}_session HASH: a message carrying "gen" (the id of the session its
--   subscription belonged to, set by the fan-out) is stored only while that session is the client's current
--   persistent session.  Messages of a discarded session still in the pipeline (clean start, expiry, DISCONNECT
--   with expiry 0) are dropped, not saved into the next session's queue ([MQTT-3.1.2-4]).
--   Its field "score" is the highest score this session ever gave: a new message's score is
--   max(top of the ZSET, "score") + 1, so scores never decrease within a session.  Top + 1 alone falls at or below
--   the delivery loop's cursor once newer messages are acknowledged and removed while an older one stays (a QoS 2
--   message awaiting PUBCOMP): the new message is skipped until the next reconnect, out of order (findings.md,
--   "session-mix seeds 2 and 4").  The field is kept only while the record exists (it is never created here);
--   replace_session.lua carries it over on a resume and drops it with a discarded session, remove_all.lua drops it.
--   Without KEYS[4] (or without a record) the score is the top of the ZSET + 1.
-- ARGV[1] = limit (1..65535)   ARGV[2] = JSON array of messages   ARGV[3] = default TTL seconds
-- ARGV[4] = comma-separated defect names (empty for the correct broker)
-- A message's "expiry" (seconds, MQTT 5 message expiry interval left) replaces the default TTL;
-- expiry <= 0 means it has already expired: it is not stored and takes no packet id.
-- Payload keys are KEYS[1] .. "_" .. packet id, so they share the client's hash tag and slot.
-- Returns {previous last packet id, new last packet id, number stored, number trimmed}.
local zset, last_key, sent, session = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local limit = tonumber(ARGV[1])
local messages = cjson.decode(ARGV[2])
local default_ttl = tonumber(ARGV[3])
local defects = ARGV[4] or ""
local function defect(name) return string.find("," .. defects .. ",", "," .. name .. ",", 1, true) ~= nil end

local top = redis.call('ZREVRANGE', zset, 0, 0, 'WITHSCORES')
local stored_last = tonumber(redis.call('GET', last_key) or '0')
local last_id, score
if defect('last_packet_id_from_zset') then
  -- bug: the packet id is recovered from the newest member only; an empty queue restarts at 0
  last_id = 0
  if top[1] then last_id = tonumber(string.match(top[1], '_(%d+)$')) end
else
  last_id = stored_last
end
local previous = last_id
local current_gen, has_record, given = nil, false, nil
if session then
  has_record = redis.call('EXISTS', session) == 1
  local fields = redis.call('HMGET', session, 'gen', 'persistent', 'score')
  if fields[2] == '1' then current_gen = fields[1] end
  given = tonumber(fields[3])
end

if defect('score_from_last_packet_id') then
  -- (defect score_from_last_packet_id: every call restarts the score at the last packet id, so after a wrap
  -- a batch sorts before the messages still queued from before it)
  score = last_id
else
  score = tonumber(top[2]) or last_id
  -- never below a score this session already gave: the delivery loop's cursor may be there already
  if given and given > score then score = given end
end

local stored = 0
for _, msg in ipairs(messages) do
  local ttl = default_ttl
  if msg.expiry ~= nil and msg.expiry ~= cjson.null then ttl = tonumber(msg.expiry) end
  if session and msg.gen ~= nil and msg.gen ~= cjson.null and msg.gen ~= current_gen then
    ttl = 0  -- the session this message was routed to is gone
  end
  -- (defect zero_expiry_breaks_save: an expiry of 0 passes the guard and SET ... EX 0 fails the script
  -- half-way: the messages before it are written under ids the last packet id never records)
  if ttl > 0 or (defect('zero_expiry_breaks_save') and msg.expiry ~= nil and msg.expiry ~= cjson.null
                 and tonumber(msg.expiry) == 0) then
    last_id = last_id + 1
    -- (defect packet_id_skips_65535: the wrap test is off by one and 65535 is never handed out)
    if last_id > 65535 or (last_id == 65535 and defect('packet_id_skips_65535')) then
      -- wraparound: packet ids restart at 1 (0 is not a packet id); the score keeps growing
      if defect('packet_id_wraps_to_zero') then last_id = 0 else last_id = 1 end
      if defect('score_reset_at_wrap') then score = last_id - 1 end
    end
    score = score + 1
    msg.packetId = last_id
    if msg.packetType == nil then msg.packetType = 'PUBLISH' end
    local payload_key = zset .. '_' .. last_id
    if msg.expiry ~= nil and msg.expiry ~= cjson.null and defect('expiry_as_milliseconds') then
      redis.call('SET', payload_key, cjson.encode(msg), 'PX', ttl)
    else
      redis.call('SET', payload_key, cjson.encode(msg), 'EX', ttl)
    end
    redis.call('ZADD', zset, score, payload_key)
    stored = stored + 1
  end
end
if stored > 0 and not defect('last_packet_id_from_zset') then
  redis.call('SET', last_key, last_id)
end
if stored > 0 and has_record then
  redis.call('HSET', session, 'score', score)  -- the last score given (the highest, but for the wrap defect)
end

-- trim the oldest (lowest score) entries, payload and reference, down to the limit
local keep = limit
if defect('trim_off_by_one') then keep = limit + 1 end
local count = redis.call('ZCARD', zset)
local trimmed = 0
if count > keep then
  local excess = count - keep
  local victims
  if defect('trim_newest') then
    victims = redis.call('ZREVRANGE', zset, 0, excess - 1)
  else
    victims = redis.call('ZRANGE', zset, 0, excess - 1)
  end
  for _, member in ipairs(victims) do
    redis.call('DEL', member)
    redis.call('ZREM', zset, member)
    if sent then redis.call('HDEL', sent, member) end
  end
  trimmed = #victims
end
return {previous, last_id, stored, trimmed}
