/**
 * An error in how the CLI was called (a bad argument, a config without the member a
 * command needs, a destructive command without `--yes` and no terminal to ask on).
 * The CLI exits with code 2 for it.
 */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

const UNITS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/** Parses `500ms`, `30s`, `15m`, `12h`, `7d`, `2w` into milliseconds; throws a `UsageError` naming `what`. */
export function parseDuration(text: string, what: string): number {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$/.exec(text.trim());
  if (!match) throw new UsageError(`${what} '${text}' is not a duration (write it like 500ms, 30s, 15m, 12h, 7d or 2w)`);
  return Math.round(Number(match[1]) * UNITS[match[2]!]!);
}

/** Parses a positive integer option. */
export function parsePositiveInt(text: string, what: string): number {
  const value = Number(text);
  if (!Number.isInteger(value) || value <= 0) throw new UsageError(`${what} '${text}' is not a positive integer`);
  return value;
}

/** A short human duration: `850ms`, `12.3s`, `4m05s`, `3h12m`, `2d04h`. */
export function formatDuration(ms: number): string {
  if (ms < 1_000) return `${Math.round(ms)}ms`;
  if (ms < 60_000) return `${(ms / 1_000).toFixed(1)}s`;
  const pad = (n: number) => String(n).padStart(2, '0');
  if (ms < 3_600_000) return `${Math.floor(ms / 60_000)}m${pad(Math.floor((ms % 60_000) / 1_000))}s`;
  if (ms < 86_400_000) return `${Math.floor(ms / 3_600_000)}h${pad(Math.floor((ms % 3_600_000) / 60_000))}m`;
  return `${Math.floor(ms / 86_400_000)}d${pad(Math.floor((ms % 86_400_000) / 3_600_000))}h`;
}

/** Renders rows as left-aligned columns under a header. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((title, column) => Math.max(title.length, ...rows.map((row) => (row[column] ?? '').length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, column) => (column === cells.length - 1 ? cell : cell.padEnd(widths[column]!)))
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)].join('\n');
}

/** JSON with bigints as strings and dates as ISO text, for `--json` output. */
export function toJson(value: unknown): string {
  return JSON.stringify(value, (_key, item: unknown) => (typeof item === 'bigint' ? item.toString() : item), 2);
}
