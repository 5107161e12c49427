import { ConfigError } from './errors.js';

/**
 * Capped exponential backoff with full jitter, as used for relay and consumer retries.
 * Values are milliseconds; `maxAttempts` counts every try, the first included.
 */
export interface RetryPolicy {
  /** Tries before the message is dead-lettered (or its key halted); 1 means no retry. */
  readonly maxAttempts: number;
  readonly initialDelayMs: number;
  readonly maxDelayMs: number;
  readonly multiplier: number;
  /** 0 = exact delays, 1 = full jitter (uniform in [0, delay]); in between keeps a floor of `(1 - jitter) * delay`. */
  readonly jitter: number;
}

/** Default policy: 10 tries, 1 s doubling to 5 min, jitter on the top half. */
export const DEFAULT_RETRY_POLICY: RetryPolicy = Object.freeze({
  maxAttempts: 10,
  initialDelayMs: 1_000,
  maxDelayMs: 300_000,
  multiplier: 2,
  jitter: 0.5,
});

/** Merges `overrides` into the default policy and checks it, listing every problem. */
export function retryPolicy(overrides: Partial<RetryPolicy> = {}, name = 'retry'): RetryPolicy {
  const policy = { ...DEFAULT_RETRY_POLICY, ...overrides };
  const problems: string[] = [];
  if (!Number.isSafeInteger(policy.maxAttempts) || policy.maxAttempts < 1) problems.push(`'${name}.maxAttempts' must be an integer of 1 or more`);
  if (!(policy.initialDelayMs >= 0)) problems.push(`'${name}.initialDelayMs' must be 0 or more`);
  if (!(policy.maxDelayMs >= policy.initialDelayMs)) problems.push(`'${name}.maxDelayMs' must be at least 'initialDelayMs'`);
  if (!(policy.multiplier >= 1)) problems.push(`'${name}.multiplier' must be 1 or more`);
  if (!(policy.jitter >= 0 && policy.jitter <= 1)) problems.push(`'${name}.jitter' must be between 0 and 1`);
  if (problems.length > 0) throw new ConfigError(problems);
  return Object.freeze(policy);
}

/**
 * Delay before try number `attempt + 1`, given that `attempt` tries (1-based) failed.
 * Never negative, never above `maxDelayMs`.
 */
export function backoffDelay(policy: RetryPolicy, attempt: number, random: () => number = Math.random): number {
  const exponent = Math.max(0, attempt - 1);
  const base = Math.min(policy.maxDelayMs, policy.initialDelayMs * policy.multiplier ** exponent);
  const floor = base * (1 - policy.jitter);
  return Math.round(floor + (base - floor) * random());
}
