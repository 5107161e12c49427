// The Lua scripts behind every settle. A script runs atomically on the server, so a copy
// (a delayed retry, a dead letter, a replay) and the acknowledgement of its original happen
// together or not at all: no crash between them can lose the message or leave both. Redis
// does not roll a script back when a command in it fails, so each script first checks that
// the original is still pending for the group (XPENDING), then writes the copy, and only
// then acknowledges: a failure part-way leaves a duplicate, never a loss. Times come from
// the server's clock (TIME), so instances with skewed clocks agree on when a retry is due.

/** Server time in milliseconds (Lua prologue). */
const NOW = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

/** True (1) when ARGV[2] is pending in group ARGV[1] of stream KEYS[1]. */
const PENDING = `local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 then return 0 end`;

/**
 * Acknowledges ARGV[2] in group ARGV[1] of KEYS[1]; ARGV[3] = '1' also deletes the entry
 * (the group's own retry stream, which no other group reads). Returns XACK's count.
 */
export const ACK_SCRIPT = `local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] == '1' then redis.call('XDEL', KEYS[1], ARGV[2]) end
return n`;

/**
 * Delayed retry: adds member ARGV[4] to the due set KEYS[2] at now + ARGV[3] ms, then
 * acknowledges (and with ARGV[5] = '1' deletes) the original. Returns 0 without writing when
 * the original is no longer pending (another settle of it won).
 */
export const RETRY_SCRIPT = `${PENDING}
${NOW}
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[4])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if ARGV[5] == '1' then redis.call('XDEL', KEYS[1], ARGV[2]) end
return 1`;

/**
 * Dead letter: appends an entry with fields ARGV[4..] plus the server's time to the dead
 * stream KEYS[2], then acknowledges (ARGV[3] = '1': and deletes) the original. Returns 0
 * without writing when the original is no longer pending.
 */
export const DEAD_SCRIPT = `${PENDING}
${NOW}
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
fields[#fields + 1] = 'courier-dead-at'
fields[#fields + 1] = tostring(now)
redis.call('XADD', KEYS[2], '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] == '1' then redis.call('XDEL', KEYS[1], ARGV[2]) end
return 1`;

/**
 * Moves up to ARGV[1] due members of the due set KEYS[1] into the retry stream KEYS[2]
 * (member = "<unique>|<attempt>|<replayed 0/1>|<envelope JSON>"), appending before removing.
 * Returns {moved, ms until the next member is due or -1}.
 */
export const MOVE_DUE_SCRIPT = `${NOW}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local a = string.find(member, '|', 1, true)
  local b = string.find(member, '|', a + 1, true)
  local c = string.find(member, '|', b + 1, true)
  local attempt = string.sub(member, a + 1, b - 1)
  local envelope = string.sub(member, c + 1)
  if string.sub(member, b + 1, c - 1) == '1' then
    redis.call('XADD', KEYS[2], '*', 'envelope', envelope, 'courier-attempt', attempt, 'courier-replayed', '1')
  else
    redis.call('XADD', KEYS[2], '*', 'envelope', envelope, 'courier-attempt', attempt)
  end
  redis.call('ZREM', KEYS[1], member)
end
local next = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if next[2] then return {#due, math.max(0, tonumber(next[2]) - now)} end
return {#due, -1}`;

/**
 * Replay: copies dead entry ARGV[1] of KEYS[1] (its envelope only) into the retry stream
 * KEYS[2] with attempt 1 and the replay mark, then deletes the dead entry. Returns 0 when
 * the entry is gone or holds no envelope field.
 */
export const REPLAY_SCRIPT = `local found = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #found == 0 then return 0 end
local fields = found[1][2]
local envelope = nil
for i = 1, #fields, 2 do if fields[i] == 'envelope' then envelope = fields[i + 1] end end
if envelope == nil then return 0 end
redis.call('XADD', KEYS[2], '*', 'envelope', envelope, 'courier-attempt', '1', 'courier-replayed', '1')
redis.call('XDEL', KEYS[1], ARGV[1])
return 1`;

/** Takes or keeps the lease KEYS[1] for token ARGV[1] for ARGV[2] ms; 1 when held. */
export const LEASE_SCRIPT = `local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`;

/** Releases the lease KEYS[1] when token ARGV[1] holds it. */
export const RELEASE_SCRIPT = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`;

/** Removes consumer ARGV[2] from group ARGV[1] of KEYS[1] only when it has nothing pending (DELCONSUMER drops pending entries). */
export const FORGET_CONSUMER_SCRIPT = `local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending > 0 then return 0 end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])`;
