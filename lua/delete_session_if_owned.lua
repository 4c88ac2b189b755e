-- delete_session_if_owned: delete a (clean) session record, but only if this connection still owns it.
-- Compare-and-act in one step: a newer CONNECT's record must not be deleted by the old connection's close.
-- KEYS[1] = <prefix>{client}_session   ARGV[1] = connection id
-- Returns 1 if deleted, 0 if another connection owns the session.
if redis.call('HGET', KEYS[1], 'conn') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
