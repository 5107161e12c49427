import type { StatementLog } from '../fixtures.js';

/** A {@link StatementLog} and the hook that feeds it (see {@link recordStatements}). */
export interface StatementRecorder {
  /** The fixture's `statementLog`. */
  readonly statementLog: StatementLog;
  /** Hand this to the data layer's query hook: it keeps `text` while a `watch` runs, and drops it otherwise. */
  readonly record: (text: string) => void;
}

/**
 * Builds a fixture's {@link StatementLog} from a data layer's own query hook (knex's `'query'`
 * event, Kysely's `log`, Drizzle's or TypeORM's logger, Prisma's `query` event): pass `record`
 * to the hook and put `statementLog` on the fixture.
 *
 * Guarantees: `watch(work)` resolves with the texts `record` got while `work` ran, in the
 * order it got them, and keeps nothing recorded before or after (also when `work` throws,
 * which `watch` rethrows). One watch at a time: a second `watch` while one runs rejects, since
 * the two could not tell their statements apart. `keyedAppendStatements` is declared by the
 * fixture from its database (PostgreSQL 1; MariaDB/MySQL 2), as {@link StatementLog} says.
 */
export function recordStatements(keyedAppendStatements: number): StatementRecorder {
  if (!Number.isSafeInteger(keyedAppendStatements) || keyedAppendStatements < 1) {
    throw new Error(`'keyedAppendStatements' must be an integer of 1 or more, got ${String(keyedAppendStatements)}`);
  }
  let watched: string[] | undefined;
  return {
    record: (text) => {
      watched?.push(text);
    },
    statementLog: {
      keyedAppendStatements,
      async watch(work) {
        if (watched !== undefined) throw new Error('statementLog.watch is already watching: watch one piece of work at a time');
        const seen: string[] = [];
        watched = seen;
        try {
          await work();
        } finally {
          watched = undefined;
        }
        return seen;
      },
    },
  };
}
