-- mark_disconnected: mark a session disconnected, but only if this connection still owns it.
-- Compare-and-act in one step: a newer CONNECT (on this or another node) may have written its own record
-- since the old connection last looked, and must not be marked disconnected.
-- KEYS[1] = <prefix>{client}_session   ARGV[1] = connection id   ARGV[2] = now, ms
-- ARGV[3] (optional) = the session expiry interval in force at the disconnect, seconds ('' = never): an MQTT 5
-- DISCONNECT may have changed CONNECT's (§3.14.2.2.2), and a resuming CONNECT judges expiry from this field.
-- Returns 1 if marked, 0 if another connection owns the session.
if redis.call('HGET', KEYS[1], 'conn') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'conn', '', 'disconnected_at', ARGV[2])
if ARGV[3] then redis.call('HSET', KEYS[1], 'expiry', ARGV[3]) end
return 1
