import { pgClientListenSource, type ListenSource } from '@courier/sql-engine';
import type { Client, Pool } from 'pg';

/**
 * Where the outbox's LISTEN connection comes from on node-postgres: a `Client` of its own
 * (not one of the pool's, which would be held for good), built with the pool's connection
 * settings and the pool's `Client` class, ended when the store stops watching.
 */
export function pgListenSource(pool: Pool): ListenSource {
  const settings = pool as unknown as { options?: object; Client?: new (options?: object) => Client };
  return pgClientListenSource({
    open: async () => {
      const ClientClass = settings.Client;
      if (typeof ClientClass !== 'function') throw new Error('the pg Pool has no Client class to open a LISTEN connection with');
      const client = new ClientClass(settings.options);
      await client.connect();
      return client;
    },
    close: async (client) => {
      await (client as Client).end();
    },
  });
}
