/**
 * Ends the process with `code` once everything written to stdout and stderr has been
 * handed to the operating system. `process.exit()` alone discards what a slow pipe has not
 * taken yet (a `--json` listing read by a slow consumer was cut at 192 KiB with exit 0).
 * If the output cannot be written whole (the reader went away: EPIPE), the exit code is at
 * least 1, so a script never takes a cut listing for a complete one.
 */
export async function exitAfterOutput(code: number): Promise<never> {
  let lost = false;
  const flushed = (stream: NodeJS.WriteStream) =>
    new Promise<void>((resolve) => {
      if (stream.destroyed || !stream.writable) {
        resolve();
        return;
      }
      // An empty write's callback runs after every earlier write has been flushed (or failed).
      stream.once('error', () => {
        lost = true;
        resolve();
      });
      stream.write('', (error) => {
        if (error) lost = true;
        resolve();
      });
    });
  await Promise.all([flushed(process.stdout), flushed(process.stderr)]);
  process.exit(lost && code === 0 ? 1 : code);
}
