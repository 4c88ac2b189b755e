-- mark released: the subscriber sent PUBREC for a QoS 2 message; from now on it is resent as PUBREL.
-- KEYS[1] = <prefix>{client}_messages   ARGV[1] = packet id
-- Keeps the payload's TTL (TBMQ drops it here). Returns 1 if marked, 0 if the message is gone.
local member = KEYS[1] .. '_' .. ARGV[1]
local payload = redis.call('GET', member)
if not payload then return 0 end
local msg = cjson.decode(payload)
msg.packetType = 'PUBREL'
redis.call('SET', member, cjson.encode(msg), 'KEEPTTL')
return 1
