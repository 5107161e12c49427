import { pgClientListenSource, type ListenSource, type PgListenClient } from '@courier/sql-engine';

/** The part of knex's client used to open a connection outside its pool. */
interface RawConnectionSource {
  acquireRawConnection(): Promise<unknown>;
  destroyRawConnection(connection: unknown): Promise<void>;
}

/**
 * The LISTEN connections of a MikroORM application on PostgreSQL: raw connections of the
 * ORM's knex client (a `pg.Client`, outside knex's pool), destroyed when the store stops
 * watching. `undefined` when the connection has no knex client (no LISTEN; relays poll).
 */
export function knexListenSource(connection: unknown): ListenSource | undefined {
  const getKnex = (connection as { getKnex?: () => { client?: unknown } } | null)?.getKnex;
  const client = typeof getKnex === 'function' ? (getKnex.call(connection).client as Partial<RawConnectionSource> | undefined) : undefined;
  if (typeof client?.acquireRawConnection !== 'function' || typeof client.destroyRawConnection !== 'function') return undefined;
  const source = client as RawConnectionSource;
  return pgClientListenSource({
    open: async () => (await source.acquireRawConnection()) as PgListenClient,
    close: (raw) => source.destroyRawConnection(raw),
  });
}
