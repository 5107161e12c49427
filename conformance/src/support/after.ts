/** Resolves after `ms` without keeping the process alive (its timer is unref'd): a bound on a wait, never a wait for something to have happened. */
export function after(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}
