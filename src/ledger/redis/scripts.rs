//! The Redis ledger's Lua scripts (see the parent module for its keys).
//! Redis runs each atomically; every key a script touches is passed in
//! KEYS and carries the team's `{team}` tag, so on a Cluster all sit in
//! one slot.

/// KEYS: days, held, routes, settled, settled_at, lapsed. ARGV: amount,
/// limit (-1: none), now, first day, expires, id, today, unsettled route,
/// deadline (Redis's own clock, ms; 0: none).
/// Returns {granted (1), refused for budget (0) or too late (-1), spent,
/// held after it, Redis's clock in ms}.
///
/// **One outcome per reservation**: a reserve that Redis runs
/// after its deadline (it sat behind `DEBUG SLEEP`, a stopped process, a
/// slow script), or whose id has already ended (its caller gave up and
/// released it first), holds nothing: its caller answered without it.
/// The clock is Redis's (`TIME`, allowed before writes with effects
/// replication, the only mode since Redis 7).
/// Lapsed holds become spend on the later of their day and today's, marked
/// settled (and indexed) so a late settle counts them once; `lapsed` keeps
/// what they counted, for a late settle's excess.
pub(super) const RESERVE: &str = r#"
local t = redis.call('TIME')
local clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[9])
if (deadline > 0 and clock > deadline) or redis.call('HEXISTS', KEYS[4], ARGV[6]) == 1 then
  return {-1, 0, 0, clock}
end
local now = tonumber(ARGV[3])
local holds = redis.call('HGETALL', KEYS[2])
local held = 0
for i = 1, #holds, 2 do
  local amount, expires, day = string.match(holds[i + 1], '^(%d+):(%d+):(%d+)$')
  if amount == nil then
    redis.call('HDEL', KEYS[2], holds[i])
  elseif tonumber(expires) <= now then
    redis.call('HDEL', KEYS[2], holds[i])
    if redis.call('HSETNX', KEYS[4], holds[i], now) == 1 then
      redis.call('ZADD', KEYS[5], now, holds[i])
      if tonumber(amount) > 0 then
        local book = string.format('%d', math.max(tonumber(day), tonumber(ARGV[7])))
        redis.call('HINCRBY', KEYS[1], book, amount)
        redis.call('HINCRBY', KEYS[3], book .. '|' .. ARGV[8] .. '|s', amount)
        redis.call('HSET', KEYS[6], holds[i], amount)
      end
    end
  else
    held = held + tonumber(amount)
  end
end
local first_day = tonumber(ARGV[4])
local spent = 0
local days = redis.call('HGETALL', KEYS[1])
for i = 1, #days, 2 do
  if tonumber(days[i]) >= first_day then spent = spent + tonumber(days[i + 1]) end
end
local limit = tonumber(ARGV[2])
local amount = tonumber(ARGV[1])
if limit >= 0 and spent + held + amount > limit then
  return {0, spent, held, clock}
end
redis.call('HSET', KEYS[2], ARGV[6], amount .. ':' .. ARGV[5] .. ':' .. ARGV[7])
return {1, spent, held + amount, clock}
"#;

/// KEYS: days, held, routes, settled, settled_at, settled_scan, lapsed.
/// ARGV: id, actual, today, route, prune days before, now, forget marks
/// before, most marks to forget, hash buckets to walk, pin (0: none; else
/// the mark's score, a time ahead: it is not forgotten before that plus
/// the window, whoever settles meanwhile). Returns 0: already ended (a
/// lapsed reservation's charge above what its lapse counted is added
/// then, once; a pin moves the mark's score, never back).
///
/// Each step is O(1) or O(log marks), on at most ARGV[8] (forgotten) and
/// about ARGV[9] (walked) marks, plus the days hash (at most ~63 days): a
/// settle costs the same with a hundred marks as with a million.
pub(super) const SETTLE: &str = r#"
local now = ARGV[6]
local pin = tonumber(ARGV[10])
if redis.call('HSETNX', KEYS[4], ARGV[1], now) == 0 then
  if pin > 0 then
    local score = redis.call('ZSCORE', KEYS[5], ARGV[1])
    if not score or tonumber(score) < pin then redis.call('ZADD', KEYS[5], pin, ARGV[1]) end
  end
  local counted = tonumber(redis.call('HGET', KEYS[7], ARGV[1]) or '')
  local actual = tonumber(ARGV[2])
  if counted ~= nil and actual > counted then
    redis.call('HDEL', KEYS[7], ARGV[1])
    redis.call('HINCRBY', KEYS[1], ARGV[3], actual - counted)
    redis.call('HINCRBY', KEYS[3], ARGV[3] .. '|' .. ARGV[4] .. '|s', actual - counted)
  end
  return 0
end
if pin > 0 then redis.call('ZADD', KEYS[5], pin, ARGV[1]) else redis.call('ZADD', KEYS[5], now, ARGV[1]) end
redis.call('HDEL', KEYS[2], ARGV[1])
local actual = tonumber(ARGV[2])
if actual > 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[3], actual)
  redis.call('HINCRBY', KEYS[3], ARGV[3] .. '|' .. ARGV[4] .. '|s', actual)
end
local prune_before = tonumber(ARGV[5])
local days = redis.call('HKEYS', KEYS[1])
for _, d in ipairs(days) do
  if tonumber(d) < prune_before then redis.call('HDEL', KEYS[1], d) end
end
-- Marks past the window, oldest first, a bounded number per settle.
local forget_before = tonumber(ARGV[7])
local old = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. forget_before, 'LIMIT', 0, ARGV[8])
if #old > 0 then
  redis.call('HDEL', KEYS[4], unpack(old))
  redis.call('ZREM', KEYS[5], unpack(old))
  redis.call('HDEL', KEYS[7], unpack(old))
end
-- More marks than index entries: the previous release wrote some. Walk the
-- hash a page per settle (the cursor survives in KEYS[6]) until none is left.
if redis.call('HLEN', KEYS[4]) > redis.call('ZCARD', KEYS[5]) then
  local page = redis.call('HSCAN', KEYS[4], redis.call('GET', KEYS[6]) or '0', 'COUNT', ARGV[9])
  local marks = page[2]
  for i = 1, #marks, 2 do
    local at = tonumber(marks[i + 1])
    if at == nil or at < forget_before then
      redis.call('HDEL', KEYS[4], marks[i])
      redis.call('ZREM', KEYS[5], marks[i])
    elseif not redis.call('ZSCORE', KEYS[5], marks[i]) then
      redis.call('ZADD', KEYS[5], at, marks[i])
    end
  end
  -- Done when the cursor comes back to 0, or as soon as no mark is left
  -- unindexed: the walk is not called again then, and a cursor left
  -- behind would be a key nobody deletes.
  if page[1] == '0' or redis.call('HLEN', KEYS[4]) <= redis.call('ZCARD', KEYS[5]) then
    redis.call('DEL', KEYS[6])
  else
    redis.call('SET', KEYS[6], page[1])
  end
end
return 1
"#;

/// KEYS: held, settled, settled_at. ARGV: id, now. Ends a reservation that
/// was never used: marks it ended (so a reserve of that id that Redis runs
/// later holds nothing) and drops its hold. Idempotent; the mark is
/// forgotten with the settles' marks (twice a reservation's term).
pub(super) const END: &str = r#"
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 1 then
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
end
return redis.call('HDEL', KEYS[1], ARGV[1])
"#;
