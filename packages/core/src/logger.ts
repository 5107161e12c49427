/**
 * Structured logger port. Courier logs through it and nothing else; pino, winston and
 * console adapters are one line each. Fields are plain data.
 */
export interface Logger {
  debug(message: string, fields?: Readonly<Record<string, unknown>>): void;
  info(message: string, fields?: Readonly<Record<string, unknown>>): void;
  warn(message: string, fields?: Readonly<Record<string, unknown>>): void;
  error(message: string, fields?: Readonly<Record<string, unknown>>): void;
}

/**
 * A logger that drops everything. Not the default: pass it as `logger` to silence Courier
 * entirely (a test, or a service that reports only through metrics).
 */
export const noopLogger: Logger = Object.freeze({
  debug() {},
  info() {},
  warn() {},
  error() {},
});

/** A logger writing one JSON line per entry to the console, at `level` and above. */
export function consoleLogger(level: 'debug' | 'info' | 'warn' | 'error' = 'info'): Logger {
  const order = ['debug', 'info', 'warn', 'error'] as const;
  const threshold = order.indexOf(level);
  const write = (at: (typeof order)[number]) => (message: string, fields?: Readonly<Record<string, unknown>>) => {
    if (order.indexOf(at) < threshold) return;
    const line = JSON.stringify({ time: new Date().toISOString(), level: at, message, ...fields });
    if (at === 'error' || at === 'warn') console.error(line);
    else console.log(line);
  };
  return { debug: write('debug'), info: write('info'), warn: write('warn'), error: write('error') };
}

/**
 * The logger a bus (and the operator metrics helpers) use when none is given: warnings and
 * errors only, one JSON line each on stderr. Dead-lettering and halting a key are logged at
 * error, outages and pauses at warn, so a service built without a logger still says when a
 * message needs a person; per-message chatter (info, debug) is left out. Pass `noopLogger`
 * for silence, or an adapter over your own logger.
 */
export const defaultLogger: Logger = Object.freeze(consoleLogger('warn'));
