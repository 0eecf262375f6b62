-- For each stream KEYS[i] (i >= 2) of topic ARGV[i]: is group ARGV[1] not done
-- with it (entries pending, or entries after its last-delivered id)? Returns
-- the topics that are not done and removes the others from the backlog index
-- KEYS[1], in one atomic step: a publish (which adds its topic to the index in
-- the same step as the XADD) can never fall between the look and the removal.
local function older(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, bms = tonumber(ams), tonumber(bms)
  if ams ~= bms then
    return ams < bms
  end
  return tonumber(aseq) < tonumber(bseq)
end

local function busy(stream, name)
  if redis.call('EXISTS', stream) == 0 then
    return false
  end
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local info = {}
    for i = 1, #group, 2 do
      info[group[i]] = group[i + 1]
    end
    if info['name'] == name then
      if info['pending'] > 0 then
        return true
      end
      if type(info['lag']) == 'number' then
        return info['lag'] > 0
      end
      -- The lag is unknown (entries were deleted, or Redis < 7): compare the
      -- last entry with the group's last-delivered id.
      local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
      return #last > 0 and older(info['last-delivered-id'], last[1][1])
    end
  end
  return false
end

local out = {}
for i = 2, #KEYS do
  if busy(KEYS[i], ARGV[1]) then
    out[#out + 1] = ARGV[i]
  else
    redis.call('SREM', KEYS[1], ARGV[i])
  end
end
return out
