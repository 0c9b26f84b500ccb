-- GCRA over several buckets at once, atomically, on Redis's clock (so every API task agrees).
-- KEYS: the buckets (hash-tagged by the caller so they share a cluster slot).
-- ARGV: for each key, its emission interval T and tolerance tau, in microseconds.
-- Returns {1, tightest_key_index, remaining, reset_us} when every bucket admits (and then all
-- are updated), or {0, refusing_key_index, retry_after_us, 0} when any refuses (none updated).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local new_tats = {}
local refused, worst = 0, -1
local tightest, least, reset = 1, nil, 0
for i = 1, #KEYS do
  local T = tonumber(ARGV[2 * i - 1])
  local tau = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  if tat - now > tau then
    local retry = tat - now - tau
    if retry > worst then worst, refused = retry, i end
  else
    local nt = tat + T
    new_tats[i] = nt
    local remaining = 0
    if nt - now <= tau then remaining = math.floor((tau - (nt - now)) / T) + 1 end
    if least == nil or remaining < least then tightest, least, reset = i, remaining, nt - now end
  end
end
if refused > 0 then
  return {0, refused, worst, 0}
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], string.format('%d', new_tats[i]), 'PX', math.ceil((new_tats[i] - now) / 1000) + 1000)
end
return {1, tightest, least or 0, reset}
