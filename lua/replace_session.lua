-- replace_session: replace a session record in one step (DEL + HSET), so no reader ever finds it missing.
-- A DEL followed by a separate HSET leaves no record at all when the node dies in between (SIGKILL during a
-- CONNECT); the next node then answers a resuming client with session present = 0.
-- KEYS[1] = <prefix>{client}_session   ARGV = field1, value1, field2, value2, ...
-- KEYS[2..] (optional): a new session discards the old one's state in the same step: KEYS[2] =
-- <prefix>{client}_messages (its members, the payloads, go too), then _last_packet_id, _sent, _inbound_qos2.
-- One step matters: a save of the discarded session's messages (still in the pipeline) that runs between a
-- separate discard and the new record finds the old record and refills the queue ([MQTT-3.1.2-4]).
-- The field "score" (the highest message score the session gave, kept by save.lua) is carried over when the
-- session goes on (no KEYS[2]: a resume) and dropped with a discarded session: scores must never decrease within
-- a session, or a new message can sort at or below the delivery cursor (findings.md, "session-mix seeds 2 and 4").
-- Returns the number of fields written.
local score = nil
if KEYS[2] then
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    redis.call('DEL', member)
  end
  for i = 2, #KEYS do
    redis.call('DEL', KEYS[i])
  end
else
  score = redis.call('HGET', KEYS[1], 'score')
end
redis.call('DEL', KEYS[1])
local written = redis.call('HSET', KEYS[1], unpack(ARGV))
if score then redis.call('HSET', KEYS[1], 'score', score) end
return written
