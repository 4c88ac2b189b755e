-- mark_disconnected: mark a session disconnected, but only if this connection still owns it.
-- Compare-and-act in one step: a newer CONNECT (on this or another node) may have written its own record
-- since the old connection last looked, and must not be marked disconnected.
-- KEYS[1] = <prefix>{client}_session   ARGV[1] = connection id   ARGV[2] = now, ms
-- Returns 1 if marked, 0 if another connection owns the session.
if redis.call('HGET', KEYS[1], 'conn') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'conn', '', 'disconnected_at', ARGV[2])
return 1
