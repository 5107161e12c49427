import type { Logger } from '@courier/core';

/**
 * A Courier logger for the demo: warnings and errors are printed the first time each
 * distinct message appears (with its fields) and only counted afterwards, so a run shows
 * what happened without a line per message. Debug and info are printed only when verbose.
 */
export class ConciseLogger implements Logger {
  readonly #prefix: string;
  readonly #write: (line: string) => void;
  readonly #verbose: boolean;
  readonly #repeats = new Map<string, number>();

  constructor(prefix: string, write: (line: string) => void, verbose = false) {
    this.#prefix = prefix;
    this.#write = write;
    this.#verbose = verbose;
  }

  debug(message: string, fields?: Readonly<Record<string, unknown>>): void {
    if (this.#verbose) this.#print('debug', message, fields);
  }

  info(message: string, fields?: Readonly<Record<string, unknown>>): void {
    if (this.#verbose) this.#print('info', message, fields);
  }

  warn(message: string, fields?: Readonly<Record<string, unknown>>): void {
    this.#once('warn', message, fields);
  }

  error(message: string, fields?: Readonly<Record<string, unknown>>): void {
    this.#once('error', message, fields);
  }

  /** One line per message that was logged more than once, with how often it was suppressed. */
  summary(): string[] {
    return [...this.#repeats].filter(([, count]) => count > 1).map(([key, count]) => `${this.#prefix.trim()} ${key} (x${count}, first one shown)`);
  }

  #once(level: 'warn' | 'error', message: string, fields: Readonly<Record<string, unknown>> | undefined): void {
    const key = `${level}: ${message}`;
    const count = (this.#repeats.get(key) ?? 0) + 1;
    this.#repeats.set(key, count);
    if (count === 1 || this.#verbose) this.#print(level, message, fields);
  }

  #print(level: string, message: string, fields: Readonly<Record<string, unknown>> | undefined): void {
    const rendered = fields && Object.keys(fields).length > 0 ? ` ${JSON.stringify(fields)}` : '';
    this.#write(`${this.#prefix} ${level}: ${message}${rendered}`);
  }
}
