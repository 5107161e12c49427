// The relay process of the kill test: a bus over the test's outbox with the log-tailing
// store on the test's slot, whose transport writes each batch's message ids to a table
// (`<id>_sent`, committed) and then never answers — the broker has the messages, the relay
// has no confirm. Prints `STREAMING` once the slot is read, `SENT <ids>` after each batch.
import { createBus, noopLogger, type Transport } from '@courier/core';
import { MikroOrmOutboxStore } from '@courier/mikro-orm';
import type { EntityManager, Options } from '@mikro-orm/core';
import pg from 'pg';
import { PgLogicalOutboxStore } from '../../src/index.js';
import { PG_URL } from './fixture.js';

const config = JSON.parse(process.env['COURIER_LOG_TAIL_WORKER'] ?? '{}') as { id: string; leaseMs: number };
const { MikroORM } = await import('@mikro-orm/postgresql');
const orm = await MikroORM.init({ clientUrl: PG_URL, entities: [], debug: false, discovery: { warnWhenNoEntities: false } } as Options);
const tablePrefix = `${config.id}_`;
const sent = new pg.Pool({ connectionString: PG_URL, max: 1 });
const transport: Transport = {
  capabilities: { orderingByKey: true, orderedPipelining: false, nativeDelay: false, nativeDeadLetter: false, maxMessageBytes: 1024 * 1024 },
  async publish(messages) {
    const ids = messages.map((message) => message.messageId);
    await sent.query(`INSERT INTO "${config.id}_sent" (message_id) SELECT unnest($1::text[])`, [ids]);
    process.stdout.write(`SENT ${JSON.stringify(ids)}\n`);
    return new Promise(() => {});
  },
  subscribe: () => Promise.reject(new Error('publishes only')),
  close: () => Promise.resolve(),
};
const store = new PgLogicalOutboxStore<EntityManager>({
  store: new MikroOrmOutboxStore({ orm, tablePrefix, wakeups: false }),
  connection: { connectionString: PG_URL },
  slot: config.id,
  tables: { tablePrefix },
});
const bus = createBus({ outbox: store, transport, logger: noopLogger, relay: { pollIntervalMs: 60_000, leaseMs: config.leaseMs } });
await store.watch(() => undefined);
while (!store.streaming) await new Promise((resolve) => setTimeout(resolve, 20));
await bus.start({ consumers: false });
process.stdout.write('STREAMING\n');
