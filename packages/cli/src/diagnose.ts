/**
 * What went wrong, in an operator's words: the kind of an expected failure, the remedy to
 * print under it, and the exit code (the README's table: 1 failure, 2 usage).
 */
export interface Diagnosis {
  readonly kind:
    | 'unreachable'
    | 'database-missing'
    | 'login-refused'
    | 'vhost-refused'
    | 'permission-denied'
    | 'schema-missing'
    | 'config-invalid'
    | 'config-code-failed';
  readonly remedy: string;
  readonly exit: 1 | 2;
}

/** The facts of one error of a cause chain the classification looks at. */
interface Link {
  readonly name: string;
  readonly message: string;
  /** A driver's code: PostgreSQL SQLSTATE (`42501`), mysql/mariadb `ER_…`, Node's `ECONNREFUSED`, or Courier's. */
  readonly code: string | undefined;
  /** mysql/mariadb's numeric error. */
  readonly errno: number | undefined;
  /** Courier's errors: whether the same call may succeed later. */
  readonly retriable: boolean | undefined;
}

/**
 * The error and its causes, outermost first. Read by shape, not `instanceof`: the config is
 * loaded through tsx, whose `tsImport` gives every module it loads (the stores, the
 * transport, their copy of `@courier/core`) a namespace of its own, so the errors they
 * throw are never instances of the CLI's `CourierError` class.
 */
function chain(error: unknown): Link[] {
  const links: Link[] = [];
  const seen = new Set<unknown>();
  for (let current: unknown = error; current !== null && current !== undefined && !seen.has(current) && links.length < 10; ) {
    seen.add(current);
    if (typeof current !== 'object') {
      links.push({ name: '', message: String(current), code: undefined, errno: undefined, retriable: undefined });
      break;
    }
    const e = current as { name?: unknown; message?: unknown; code?: unknown; errno?: unknown; retriable?: unknown; cause?: unknown };
    links.push({
      name: typeof e.name === 'string' ? e.name : '',
      message: typeof e.message === 'string' ? e.message : '',
      code: typeof e.code === 'string' ? e.code : typeof e.code === 'number' ? String(e.code) : undefined,
      errno: typeof e.errno === 'number' ? e.errno : undefined,
      retriable: typeof e.retriable === 'boolean' ? e.retriable : undefined,
    });
    current = e.cause;
  }
  return links;
}

const UNREACHABLE = /ECONNREFUSED|ENOTFOUND|ETIMEDOUT|EHOSTUNREACH|ECONNRESET|EAI_AGAIN|getaddrinfo|Connection terminated|SQLITE_CANTOPEN|is unreachable|connect timed out/i;
const UNREACHABLE_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'ETIMEDOUT', 'EHOSTUNREACH', 'ECONNRESET', 'EAI_AGAIN', 'SQLITE_CANTOPEN']);

/** PostgreSQL: invalid_catalog_name. mysql/mariadb: ER_BAD_DB_ERROR. */
const isDatabaseMissing = (link: Link): boolean =>
  link.code === '3D000' || link.errno === 1049 || link.code === 'ER_BAD_DB_ERROR' || /database "[^"]*" does not exist|Unknown database '/i.test(link.message);

/** PostgreSQL: invalid_password / invalid_authorization_specification. mysql/mariadb: ER_ACCESS_DENIED_ERROR. AMQP: a refused login. */
const isLoginRefused = (link: Link): boolean =>
  link.code === '28P01' ||
  link.code === '28000' ||
  link.errno === 1045 ||
  link.code === 'ER_ACCESS_DENIED_ERROR' ||
  /password authentication failed|role "[^"]*" does not exist|no pg_hba\.conf entry|Access denied for user|ACCESS.REFUSED - Login was refused|Login was refused/i.test(link.message);

/**
 * RabbitMQ closes the connection at `connection.open` when the virtual host does not
 * exist or the user may not use it; amqplib reports only the close frame it got instead.
 */
const isVhostRefused = (link: Link): boolean => /Expected ConnectionOpenOk|NOT_ALLOWED - (vhost|access to vhost)/i.test(link.message);

/**
 * PostgreSQL: insufficient_privilege. mysql/mariadb: ER_TABLEACCESS_DENIED_ERROR,
 * ER_COLUMNACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR. AMQP: ACCESS_REFUSED on a queue
 * or exchange (a refused login is told apart above).
 */
const isPermissionDenied = (link: Link): boolean =>
  link.code === '42501' ||
  link.errno === 1142 ||
  link.errno === 1143 ||
  link.errno === 1044 ||
  /permission denied for|command denied to user|ACCESS_REFUSED - access to/i.test(link.message);

/** Courier's SCHEMA_MISSING, or the driver's "no such table" when a store did not translate it. */
const isSchemaMissing = (link: Link): boolean =>
  link.code === 'SCHEMA_MISSING' || link.code === '42P01' || link.errno === 1146 || /courier schema is missing|relation "[^"]*" does not exist|Table '[^']*' doesn't exist|no such table/i.test(link.message);

const isUnreachable = (link: Link): boolean =>
  (link.code !== undefined && UNREACHABLE_CODES.has(link.code)) ||
  UNREACHABLE.test(link.message) ||
  (link.retriable === true && (link.code === 'STORAGE' || link.code === 'TRANSPORT'));

/**
 * Classifies an error an operator command failed with, looking through its causes.
 * Returns `undefined` for an error it does not recognise (a bug: the CLI prints it as
 * unexpected). The order matters: a refused login or a missing database is also wrapped
 * as a connection failure by some drivers, so the specific kinds are tried first, over the
 * whole chain, before the generic "unreachable".
 */
export function diagnose(error: unknown, options: { readonly fromConfigCode?: boolean } = {}): Diagnosis | undefined {
  const links = chain(error);
  const any = (test: (link: Link) => boolean) => links.some(test);
  if (any(isDatabaseMissing)) {
    return {
      kind: 'database-missing',
      exit: 1,
      remedy:
        'check the database name in the address your courier config uses; courier never creates a database (keep `ensureDatabase: false` in the config\'s MikroORM.init, so a mistyped name fails here instead of creating an empty database)',
    };
  }
  if (any(isLoginRefused)) {
    return { kind: 'login-refused', exit: 1, remedy: 'the server refused the login: check the user name and password in the address your courier config uses (and that the user exists on that server)' };
  }
  if (any(isVhostRefused)) {
    return {
      kind: 'vhost-refused',
      exit: 1,
      remedy: 'the broker accepted the login but refused the virtual host: check the vhost in the broker address your courier config uses, and that the user may use it (`rabbitmqctl list_permissions -p <vhost>`)',
    };
  }
  if (any(isPermissionDenied)) {
    return {
      kind: 'permission-denied',
      exit: 1,
      remedy:
        'the user in your courier config lacks a privilege: grant it SELECT, INSERT, UPDATE and DELETE on the courier tables (or, on the broker, configure/write/read on the courier queues and exchanges), or use the user your services run with',
    };
  }
  if (any(isSchemaMissing)) {
    return {
      kind: 'schema-missing',
      exit: 1,
      remedy: 'run `courier migrate` (or `courier migrate --print` to hand the SQL to a DBA); if the schema exists, check that the tablePrefix in your courier config is the one your services use',
    };
  }
  if (any(isUnreachable)) {
    return { kind: 'unreachable', exit: 1, remedy: 'is the database or broker running and reachable at the address your courier config uses? Start it, or fix the address, and run the command again.' };
  }
  if (any((link) => link.code === 'CONFIG_INVALID')) {
    return { kind: 'config-invalid', exit: 2, remedy: 'fix the courier config (the message names what is wrong) and run the command again' };
  }
  if (options.fromConfigCode) {
    return {
      kind: 'config-code-failed',
      exit: 1,
      remedy: "the error comes from your courier config's own code (its function, or a client it builds): fix it and run the command again; COURIER_DEBUG=1 shows where it was thrown",
    };
  }
  return undefined;
}

/**
 * Whether `error` is one of Courier's errors (a `code` and a `retriable` flag), from any copy
 * of `@courier/core`: its message was written for a person, so it is printed as is.
 */
export function isCourierShaped(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const e = error as { code?: unknown; retriable?: unknown };
  return typeof e.code === 'string' && typeof e.retriable === 'boolean';
}
