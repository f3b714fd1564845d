#pragma once

// The Lua scripts RedisWorkQueue runs: each multi-key update in one atomic step, so a call
// retried after a dropped connection is safe. Layout of the keys: see redis_queue.h.

namespace kforge::redis_scripts {

// ListWorkers: forget a worker's entry only if it is still the stale one that was read.
inline constexpr char kForgetWorkerScript[] = R"lua(
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
)lua";

// Stats: ARGV = work-stream key pattern, group. For each work stream: key, length, entries the
// group holds (leased), and the age in ms of the oldest entry not yet delivered (0 when none),
// on the server's clock (entry ids are its milliseconds).
inline constexpr char kStatsScript[] = R"lua(
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local out = {}
local cursor = '0'
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 100, 'TYPE', 'stream')
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    local pending, last = 0, '0-0'
    local groups = redis.pcall('XINFO', 'GROUPS', key)
    if type(groups) == 'table' and groups.err == nil then
      for _, g in ipairs(groups) do
        local f = {}
        for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
        if f['name'] == ARGV[2] then pending, last = f['pending'], f['last-delivered-id'] end
      end
    end
    local oldest = 0
    local first = redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1)
    if #first > 0 then oldest = math.max(0, now_ms - tonumber(string.match(first[1][1], '^(%d+)'))) end
    table.insert(out, {key, redis.call('XLEN', key), pending, oldest})
  end
until cursor == '0'
return out
)lua";

// AckResults: acknowledge and delete result entries, ARGV = group, ids... (a group lost with the
// data is no error). A result's candidate key (its 'ck' field) that still marks this result as
// owed is freed: the candidate may be queued again (it is stored now).
inline constexpr char kAckScript[] = R"lua(
for i = 2, #ARGV do
  local e = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  if #e == 1 then
    local f = e[1][2]
    for k = 1, #f, 2 do
      if f[k] == 'ck' and redis.call('GET', f[k + 1]) == 'r:' .. ARGV[i] then redis.call('DEL', f[k + 1]) end
    end
  end
end
pcall(redis.call, 'XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
return redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
)lua";

// Enqueue: KEYS = candidate key, work stream, job hash, problem key; ARGV = payload, ttl ms.
// -1 when the problem key is missing (the caller stores it and calls again).
inline constexpr char kEnqueueScript[] = R"lua(
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[4]) == 0 then return -1 end
local id = redis.call('XADD', KEYS[2], '*', 'req', ARGV[1], 'prob', KEYS[4])
redis.call('SET', KEYS[1], id, 'PX', ARGV[2])
redis.call('HSET', KEYS[3], id .. ' ' .. KEYS[2], KEYS[1])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1
)lua";

// Finish (complete or poison): KEYS = work stream, result stream, candidate key, job hash;
// ARGV = entry id, result payload, group, delivery count. Only the current delivery acknowledges
// the item; the result is published either way. The candidate key then marks the result as owed
// ('r:' and its entry id) until the coordinator acknowledges it, so that a coordinator that
// restarts before storing it does not queue the candidate again (it reads the result instead).
inline constexpr char kFinishScript[] = R"lua(
local p = redis.pcall('XPENDING', KEYS[1], ARGV[3], ARGV[1], ARGV[1], 1)
local current = type(p) == 'table' and p.err == nil and #p == 1 and tostring(p[1][4]) == ARGV[4]
if current then
  redis.call('XACK', KEYS[1], ARGV[3], ARGV[1])
  redis.call('XDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1] .. ' ' .. KEYS[1])
end
local rid = redis.call('XADD', KEYS[2], '*', 'res', ARGV[2], 'ck', KEYS[3])
if current and redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('SET', KEYS[3], 'r:' .. rid, 'KEEPTTL') end
if current then return 1 end
return 0
)lua";

// Release: KEYS = work stream; ARGV = group, entry id, delivery count, lease ms. The current
// delivery's lease is made to look expired (its idle time set to a whole lease), so the next
// worker that looks for expired leases takes it; it counts as a delivery.
inline constexpr char kReleaseScript[] = R"lua(
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if type(p) ~= 'table' or p.err ~= nil or #p ~= 1 or tostring(p[1][4]) ~= ARGV[3] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], p[1][2], 0, ARGV[2], 'IDLE', ARGV[4], 'JUSTID')
return 1
)lua";

// ExtendLease: KEYS = work stream; ARGV = group, entry id, delivery count.
inline constexpr char kExtendScript[] = R"lua(
local p = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if type(p) ~= 'table' or p.err ~= nil or #p ~= 1 or tostring(p[1][4]) ~= ARGV[3] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], p[1][2], 0, ARGV[2], 'JUSTID')
return 1
)lua";

// PurgeJob: KEYS = job hash, result stream; ARGV = group. The candidate keys of the job's owed
// results go with them.
inline constexpr char kPurgeScript[] = R"lua(
local owed = redis.call('XRANGE', KEYS[2], '-', '+')
for _, e in ipairs(owed) do
  local f = e[2]
  for k = 1, #f, 2 do
    if f[k] == 'ck' and redis.call('GET', f[k + 1]) == 'r:' .. e[1] then redis.call('DEL', f[k + 1]) end
  end
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local sp = string.find(all[i], ' ', 1, true)
  local id = string.sub(all[i], 1, sp - 1)
  local stream = string.sub(all[i], sp + 1)
  redis.pcall('XACK', stream, ARGV[1], id)
  redis.call('XDEL', stream, id)
  if redis.call('GET', all[i + 1]) == id then redis.call('DEL', all[i + 1]) end
end
redis.call('DEL', KEYS[1], KEYS[2])
return #all / 2
)lua";

}  // namespace kforge::redis_scripts
