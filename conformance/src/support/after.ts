/**
 * Resolves after `ms` (with `value`, when given) without keeping the process alive (its timer
 * is unref'd): a bound on a wait, never a wait for something to have happened.
 */
export function after(ms: number): Promise<void>;
export function after<T>(ms: number, value: T): Promise<T>;
export function after<T>(ms: number, value?: T): Promise<T | undefined> {
  return new Promise((resolve) => setTimeout(() => resolve(value), ms).unref());
}
