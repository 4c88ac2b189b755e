-- lease: acquire or renew partition leases for one node, and release the ones it gives up.
-- KEYS[i] = <prefix>{ordeal}:lease:<topic>:<partition>
-- ARGV[1] = node id   ARGV[2] = lease in ms   ARGV[2 + i] = '1' want KEYS[i], '0' release it
-- Returns, per key, 1 if the node holds it after the call, else 0.
local me, ttl = ARGV[1], tonumber(ARGV[2])
local held = {}
for i, key in ipairs(KEYS) do
  local owner = redis.call('GET', key)
  if ARGV[2 + i] == '1' then
    if owner == false or owner == me then
      redis.call('SET', key, me, 'PX', ttl)
      held[i] = 1
    else
      held[i] = 0
    end
  else
    if owner == me then redis.call('DEL', key) end
    held[i] = 0
  end
end
return held
