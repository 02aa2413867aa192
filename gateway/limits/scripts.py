"""The Lua scripts behind limits: admission, settlement, and the release of an admission
that another slot refused (a Redis Cluster spreads a request's rules over slots).

Time comes from Redis (`TIME`), so every gateway replica uses one clock for rate
windows and hold expiry. Amounts of money are passed and stored as decimal strings
(nano-dollars) and only compared as Lua numbers: a Lua number handed back to Redis
could be formatted in exponent notation, which `HINCRBY` rejects.

Every amount (tokens, nano-dollars) is clamped into [-AMOUNT_CAP, AMOUNT_CAP] as it is
read: far above any real request (validation bounds them first), exact as a Lua double,
and a counter cannot be pushed past int64 by a few huge values (HINCRBY would refuse
and the settlement would be lost).

Rate limits are sliding-window counters: a hash per key or team holds this minute's
counts (`r`, `t`), the previous minute's (`pr`, `pt`) and the minute they belong to
(`w`); the estimate is `previous * (1 - elapsed fraction) + current`.
"""

from __future__ import annotations

WINDOW_MS = 60_000
AMOUNT_CAP = 10**15  # tokens or nano-dollars ($1M): < 2^53, so exact in Lua

# Shared by both scripts: whole-number formatting and the clamp.
_PRELUDE = """
local function int(x) return string.format('%d', x) end
local function amount(x)
  local v = tonumber(x) or 0
  if v > __CAP__ then return __CAP__ elseif v < -__CAP__ then return -__CAP__ end
  return v
end
""".replace("__CAP__", str(AMOUNT_CAP))

# KEYS: the rate hashes (n_rate), then per budget its hash and its set of holds.
# ARGV: 1 request id, 2 hold ms, 3 n_rate, 4 n_budget, 5 n_options, 6 tokens,
#       then the options' worst-case costs, then per rate rule rpm and tpm (0: none),
#       then per budget: limit, soft limit (-1: none), option past soft (0: none), expire-at,
#       seed (the ledger's spend in the period; -1: none).
# Returns {1, option, window, (requests left, tokens left) per rule, past-soft per budget,
#          unseeded per budget (its counters hold no seed: field `seeded` unset)},
#         {0, 1, rule, kind (1 requests, 2 tokens), previous, current, elapsed ms}, or
#         {0, 2, budget, spent + reserved, worst case, option, spent, limit}: the first
#         budget the request cannot fit even once the holds of requests in flight are
#         released (spent), else the first it does not fit now (busy).
ADMIT_LUA = (
    _PRELUDE
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = math.floor(now / __WINDOW__)
local elapsed = now - window * __WINDOW__
local weight = 1 - elapsed / __WINDOW__
local id = ARGV[1]
local n_rate, n_budget, n_opt = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens = amount(ARGV[6])
local a = 7 + n_opt
local rates = {}
for i = 1, n_rate do
  local s = redis.call('HMGET', KEYS[i], 'w', 'r', 't', 'pr', 'pt')
  local w = tonumber(s[1])
  local r, tk = tonumber(s[2]) or 0, tonumber(s[3]) or 0
  local pr, pt = tonumber(s[4]) or 0, tonumber(s[5]) or 0
  if w ~= window then
    if w == window - 1 then pr, pt = r, tk else pr, pt = 0, 0 end
    r, tk = 0, 0
  end
  local rpm, tpm = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  if rpm > 0 and pr * weight + r + 1 > rpm then return {0, 1, i, 1, pr, r, elapsed} end
  if tpm > 0 and pt * weight + tk + tokens > tpm then return {0, 1, i, 2, pt, tk, elapsed} end
  rates[i] = {r, tk, pr, pt, rpm, tpm}
end
local budgets = {}
local option = 1
for b = 1, n_budget do
  local hash, held = KEYS[n_rate + 2 * b - 1], KEYS[n_rate + 2 * b]
  -- The ledger's spend (read before this call) is taken once per period's counters,
  -- as the larger of it and what they hold: counters created without a seed (none
  -- offered, or lost and created again) hold only spend settled since, which the
  -- ledger has too (or soon will): nothing is counted twice.
  local seed = amount(ARGV[a + 4])
  local unseeded = redis.call('HEXISTS', hash, 'seeded') == 0
  if seed >= 0 and unseeded then
    local spent = tonumber(redis.call('HGET', hash, 'spent')) or 0
    redis.call('HSET', hash, 'spent', int(math.max(spent, seed)), 'seeded', '1')
    redis.call('EXPIREAT', hash, ARGV[a + 3])
    unseeded = false
  end
  -- Holds past their expiry belong to requests whose worker died: release them.
  local expired = redis.call('ZRANGEBYSCORE', held, '-inf', int(now), 'LIMIT', 0, 100)
  for _, rid in ipairs(expired) do
    local amount = redis.call('HGET', hash, 'h:' .. rid)
    if amount then
      if amount ~= '0' then redis.call('HINCRBY', hash, 'reserved', '-' .. amount) end
      redis.call('HDEL', hash, 'h:' .. rid)
    end
    redis.call('ZREM', held, rid)
  end
  local s = redis.call('HMGET', hash, 'spent', 'reserved')
  local used = (tonumber(s[1]) or 0) + (tonumber(s[2]) or 0)
  local soft, down = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local past = soft >= 0 and used >= soft
  if past and down > 0 and option == 1 then option = down + 1 end
  budgets[b] = {hash, held, used, amount(ARGV[a]), ARGV[a + 3], past and 1 or 0,
                unseeded and 1 or 0, tonumber(s[1]) or 0}
  a = a + 5
end
local cost = amount(ARGV[6 + option])
local cost_arg = int(cost)
local busy = nil
for b = 1, n_budget do
  local bb = budgets[b]
  if bb[3] + cost > bb[4] then
    if bb[8] + cost > bb[4] then return {0, 2, b, bb[3], cost, option - 1, bb[8], bb[4]} end
    busy = busy or b
  end
end
if busy then
  local bb = budgets[busy]
  return {0, 2, busy, bb[3], cost, option - 1, bb[8], bb[4]}
end
local out = {1, option - 1, window}
for i = 1, n_rate do
  local r = rates[i]
  redis.call('HSET', KEYS[i], 'w', int(window), 'r', int(r[1] + 1), 't', int(r[2] + tokens),
             'pr', int(r[3]), 'pt', int(r[4]))
  redis.call('PEXPIRE', KEYS[i], 2 * __WINDOW__)
  out[#out + 1] = r[5] > 0 and math.max(0, math.floor(r[5] - (r[3] * weight + r[1] + 1))) or -1
  out[#out + 1] = r[6] > 0 and math.max(0, math.floor(r[6] - (r[4] * weight + r[2] + tokens))) or -1
end
for b = 1, n_budget do
  local bu = budgets[b]
  redis.call('HINCRBY', bu[1], 'reserved', cost_arg)
  redis.call('HSET', bu[1], 'h:' .. id, cost_arg)
  redis.call('ZADD', bu[2], int(now + tonumber(ARGV[2])), id)
  redis.call('EXPIREAT', bu[1], bu[5])
  redis.call('EXPIREAT', bu[2], bu[5])
  out[#out + 1] = bu[6]
end
for b = 1, n_budget do out[#out + 1] = budgets[b][7] end
return out
"""
).replace("__WINDOW__", str(WINDOW_MS))

# KEYS: 1 the settled marker, the rate hashes (n_rate), then per budget its hash and holds.
# ARGV: 1 request id, 2 marker ttl s, 3 n_rate, 4 n_budget, 5 window (-1: none),
#       6 token delta, 7 cost, then per budget its expire-at.
# Returns {0} if the request was settled before, else {1, (spent, reserved) per budget}.
SETTLE_LUA = (
    _PRELUDE
    + """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then return {0} end
local id = ARGV[1]
local n_rate, n_budget, window = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local delta, cost = int(amount(ARGV[6])), int(amount(ARGV[7]))
if delta ~= '0' and window >= 0 then
  for i = 1, n_rate do
    local w = tonumber(redis.call('HGET', KEYS[1 + i], 'w'))
    if w == window then
      redis.call('HINCRBY', KEYS[1 + i], 't', delta)
    elseif w == window + 1 then
      redis.call('HINCRBY', KEYS[1 + i], 'pt', delta)
    end
  end
end
local out = {1}
for b = 1, n_budget do
  local hash, held = KEYS[1 + n_rate + 2 * b - 1], KEYS[1 + n_rate + 2 * b]
  local amount = redis.call('HGET', hash, 'h:' .. id)
  if amount then
    if amount ~= '0' then redis.call('HINCRBY', hash, 'reserved', '-' .. amount) end  -- not '-0'
    redis.call('HDEL', hash, 'h:' .. id)
    redis.call('ZREM', held, id)
  end
  if cost ~= '0' then redis.call('HINCRBY', hash, 'spent', cost) end
  redis.call('EXPIREAT', hash, ARGV[7 + b])
  redis.call('EXPIREAT', held, ARGV[7 + b])
  local s = redis.call('HMGET', hash, 'spent', 'reserved')
  out[#out + 1] = tonumber(s[1]) or 0
  out[#out + 1] = tonumber(s[2]) or 0
end
return out
"""
)

# KEYS: the rate hashes (n_rate), then per budget its hash and its set of holds.
# ARGV: 1 request id, 2 n_rate, 3 n_budget, 4 window, 5 tokens counted at admission.
# Undoes what ADMIT_LUA reserved for the request: its holds, and its counts in the rate
# windows if the minute has not turned (a turned minute has forgotten them anyway).
RELEASE_LUA = (
    _PRELUDE
    + """
local id = ARGV[1]
local n_rate, n_budget, window = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens = amount(ARGV[5])
for i = 1, n_rate do
  if tonumber(redis.call('HGET', KEYS[i], 'w')) == window then
    local s = redis.call('HMGET', KEYS[i], 'r', 't')
    redis.call('HSET', KEYS[i], 'r', int(math.max(0, (tonumber(s[1]) or 0) - 1)),
               't', int(math.max(0, (tonumber(s[2]) or 0) - tokens)))
  end
end
for b = 1, n_budget do
  local hash, held = KEYS[n_rate + 2 * b - 1], KEYS[n_rate + 2 * b]
  local amount = redis.call('HGET', hash, 'h:' .. id)
  if amount then
    if amount ~= '0' then redis.call('HINCRBY', hash, 'reserved', '-' .. amount) end
    redis.call('HDEL', hash, 'h:' .. id)
    redis.call('ZREM', held, id)
  end
end
return 1
"""
)

# KEYS: a budget's hash and its set of holds. Returns spent + reserved as the admission
# sees it: less the holds past their expiry (a dead worker's; the admission releases
# them, this only reads). On a cluster, the plan every slot admits is read with it.
USED_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'spent', 'reserved')
local used = (tonumber(s[1]) or 0) + (tonumber(s[2]) or 0)
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)
for _, rid in ipairs(expired) do
  used = used - (tonumber(redis.call('HGET', KEYS[1], 'h:' .. rid)) or 0)
end
return string.format('%d', used)
"""
