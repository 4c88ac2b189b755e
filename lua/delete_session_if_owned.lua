-- delete_session_if_owned: delete a session record, but only if this connection still owns it.
-- Compare-and-act in one step: a newer CONNECT's record must not be deleted by the old connection's close.
-- KEYS[1] = <prefix>{client}_session   ARGV[1] = connection id ('' = a disconnected session: the expiry sweep)
-- KEYS[2..] (optional): the session ends, so its state goes in the same step: KEYS[2] =
-- <prefix>{client}_messages (its members, the payloads, go too), then _last_packet_id, _sent, _inbound_qos2.
-- Returns 1 if deleted, 0 if another connection owns the session (or there is none).
if redis.call('HGET', KEYS[1], 'conn') ~= ARGV[1] then
  return 0
end
if KEYS[2] then
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    redis.call('DEL', member)
  end
  for i = 2, #KEYS do
    redis.call('DEL', KEYS[i])
  end
end
redis.call('DEL', KEYS[1])
return 1
