-- Run one command (ARGV[2..]: an XREADGROUP without BLOCK, or an XCLAIM) on
-- the stream KEYS[2] only while the lease KEYS[1] is held by an owner whose
-- name starts with ARGV[1] (Capability.FENCED_TAKES): a reader whose lease is
-- gone takes nothing, however late its request reaches the server. The lease
-- value is "<token>:<owner>" (see acquire.lua).
-- Returns {0} when fenced off; else {1, the command's reply, the id of the
-- stream's newest entry ('0-0' if none)}: a reader that got nothing waits with
-- XREAD BLOCK after that id, so an entry added after this ran wakes it.
local v = redis.call('GET', KEYS[1])
if not v then
  return {0}
end
local owner = string.sub(v, string.find(v, ':', 1, true) + 1)
if string.sub(owner, 1, #ARGV[1]) ~= ARGV[1] then
  return {0}
end
local reply = redis.call(unpack(ARGV, 2))
local newest = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
return {1, reply, newest[1] and newest[1][1] or '0-0'}
