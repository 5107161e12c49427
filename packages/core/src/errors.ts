/**
 * Stable machine-readable error codes. Callers branch on `code` (and on `retriable`),
 * never on message text.
 */
export type CourierErrorCode =
  | 'CONFIG_INVALID'
  | 'CLOSED'
  | 'UNIT_OF_WORK_REQUIRED'
  | 'UNIT_OF_WORK_ENDED'
  | 'DUPLICATE_MESSAGE_ID'
  | 'MESSAGE_INVALID'
  | 'PAYLOAD_NOT_JSON'
  | 'PAYLOAD_TOO_LARGE'
  | 'PAYLOAD_INVALID'
  | 'ENVELOPE_INVALID'
  | 'UNKNOWN_MESSAGE_TYPE'
  | 'UNSUPPORTED_VERSION'
  | 'HANDLER_FAILED'
  | 'UNRECOVERABLE'
  | 'CRASH_LOOP'
  | 'ATTEMPTS_EXHAUSTED'
  | 'STORAGE'
  | 'SCHEMA_MISSING'
  | 'TRANSPORT'
  | 'PUBLISH_REJECTED'
  | 'PUBLISH_UNROUTABLE'
  | 'PUBLISH_TIMEOUT'
  | 'PUBLISH_BACKPRESSURE'
  | 'ABORTED'
  | 'FAULT_INJECTED';

/** Options shared by every Courier error constructor. */
export interface CourierErrorOptions {
  /** The underlying error, kept as the standard `cause`. */
  readonly cause?: unknown;
  /** Overrides the subclass default: whether retrying the same operation may succeed. */
  readonly retriable?: boolean;
}

/**
 * The registry-wide key under which each of Courier's error classes names its kind. Two
 * copies of `@courier/core` in one process (an application bundling its own, or `courier
 * relay`, whose tsx loads the config's stores and transport under a module namespace of
 * their own) have two `CourierError` classes; `Symbol.for` gives both the same key.
 */
const ERROR_KIND: unique symbol = Symbol.for('@courier/core.error-kind') as never;

/**
 * Base class of every error Courier throws or reports.
 *
 * Guarantees: `code` is stable across releases; `retriable` tells retry logic whether
 * the same operation may succeed later (a lost connection) or never will (a constraint
 * violation, a malformed payload); `cause` carries the driver's original error.
 *
 * `instanceof` holds across copies of `@courier/core` in one process: an error built by
 * another copy's `StorageError` is `instanceof StorageError` (and `CourierError`) here too.
 * Without it an error from a store loaded by another copy lost its code and retriability
 * (`describeError` dropped `[PUBLISH_UNROUTABLE]`, so `courier dead replay --code …`
 * found nothing; a retriable `StorageError` counted as a handler failure). A class of
 * Courier's matches by its kind; a subclass written outside Courier matches as usual.
 */
export class CourierError extends Error {
  /** The kind another copy's class of the same name matches (see the class comment). */
  static readonly [ERROR_KIND]: string = 'CourierError';

  /** `instanceof` by prototype, else by a Courier kind on `value`'s prototype chain. */
  static override [Symbol.hasInstance](value: unknown): boolean {
    if (Function.prototype[Symbol.hasInstance].call(this, value)) return true;
    // A class without a kind of its own (a user's subclass) matches only its own instances:
    // an inherited kind would make every `StorageError` an instance of `MyStorageError`.
    if (!Object.hasOwn(this, ERROR_KIND) || value === null || (typeof value !== 'object' && typeof value !== 'function')) return false;
    const kind = (this as { [ERROR_KIND]?: unknown })[ERROR_KIND];
    for (let proto: unknown = Object.getPrototypeOf(value); proto !== null && typeof proto === 'object'; proto = Object.getPrototypeOf(proto)) {
      const constructor: unknown = Object.hasOwn(proto, 'constructor') ? (proto as { constructor: unknown }).constructor : undefined;
      if (typeof constructor === 'function' && Object.hasOwn(constructor, ERROR_KIND) && (constructor as { [ERROR_KIND]?: unknown })[ERROR_KIND] === kind) return true;
    }
    return false;
  }

  override readonly name: string = 'CourierError';
  readonly code: CourierErrorCode;
  readonly retriable: boolean;

  constructor(code: CourierErrorCode, message: string, options: CourierErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.retriable = options.retriable ?? false;
  }
}

/**
 * Invalid configuration or API misuse. Never retriable: the same call fails again.
 * `problems` lists every problem found, not just the first.
 */
export class ConfigError extends CourierError {
  static override readonly [ERROR_KIND]: string = 'ConfigError';
  override readonly name: string = 'ConfigError';
  readonly problems: readonly string[];

  constructor(problems: readonly string[] | string, options: CourierErrorOptions & { code?: CourierErrorCode } = {}) {
    const list = typeof problems === 'string' ? [problems] : problems;
    super(options.code ?? 'CONFIG_INVALID', list.length === 1 ? list[0]! : `${list.length} problems: ${list.join('; ')}`, {
      ...options,
      retriable: false,
    });
    this.problems = list;
  }
}

/** An operation was attempted on a component that is closing or closed. Not retriable. */
export class ClosedError extends CourierError {
  static override readonly [ERROR_KIND]: string = 'ClosedError';
  override readonly name: string = 'ClosedError';

  constructor(what: string, options: CourierErrorOptions = {}) {
    super('CLOSED', `'${what}' is closed`, { ...options, retriable: false });
  }
}

/**
 * A database operation failed. Retriable for connection loss, deadlocks and
 * serialization failures; not retriable for constraint or syntax errors.
 */
export class StorageError extends CourierError {
  static override readonly [ERROR_KIND]: string = 'StorageError';
  override readonly name: string = 'StorageError';

  constructor(message: string, options: CourierErrorOptions & { code?: CourierErrorCode } = {}) {
    super(options.code ?? 'STORAGE', message, options);
  }
}

/**
 * A broker operation failed. When thrown from `Transport.publish` it means the
 * transport as a whole is unavailable (the relay pauses and burns no attempts);
 * when carried in a per-message result it concerns that message only.
 */
export class TransportError extends CourierError {
  static override readonly [ERROR_KIND]: string = 'TransportError';
  override readonly name: string = 'TransportError';

  constructor(message: string, options: CourierErrorOptions & { code?: CourierErrorCode } = {}) {
    super(options.code ?? 'TRANSPORT', message, { retriable: true, ...options });
  }
}

/**
 * A value could not be encoded or decoded: a payload that is not plain JSON, too
 * large, rejected by its schema, or an envelope that is malformed. Not retriable.
 * `path` points at the offending field (`payload.items[2].price`).
 */
export class SerializationError extends CourierError {
  static override readonly [ERROR_KIND]: string = 'SerializationError';
  override readonly name: string = 'SerializationError';
  readonly path: string | undefined;

  constructor(code: CourierErrorCode, message: string, options: CourierErrorOptions & { path?: string } = {}) {
    super(code, message, { ...options, retriable: false });
    this.path = options.path;
  }
}

/**
 * Thrown by a handler to say that retrying cannot help: the message is dead-lettered
 * at once with this error, without spending further attempts.
 */
export class UnrecoverableError extends CourierError {
  static override readonly [ERROR_KIND]: string = 'UnrecoverableError';
  override readonly name: string = 'UnrecoverableError';

  constructor(message: string, options: { cause?: unknown } = {}) {
    super('UNRECOVERABLE', message, { ...options, retriable: false });
  }
}

/** True when `error` says a retry of the same operation may succeed. Unknown errors count as retriable. */
export function isRetriable(error: unknown): boolean {
  if (error instanceof CourierError) return error.retriable;
  if (error !== null && typeof error === 'object' && 'retriable' in error) {
    return (error as { retriable: unknown }).retriable !== false;
  }
  return true;
}

/** Renders any thrown value as a one-line description for logs and dead-letter records. */
export function describeError(error: unknown): string {
  if (error instanceof Error) {
    const code = error instanceof CourierError ? ` [${error.code}]` : '';
    return `${error.name}${code}: ${error.message}`;
  }
  return String(error);
}
