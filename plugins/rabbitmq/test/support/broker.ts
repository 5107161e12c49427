import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { connect, type ChannelModel } from 'amqplib';
import { rabbitMqNames } from '../../src/index.js';

const run = promisify(execFile);

/** The broker every test uses: `COURIER_RABBITMQ_URL`, default the local guest account. */
export const BROKER_URL = process.env['COURIER_RABBITMQ_URL'] ?? 'amqp://guest:guest@127.0.0.1:5672';

/** Tiers short enough for tests: 200 ms and 600 ms. */
export const TEST_TIERS_MS: readonly number[] = [200, 600];

/** A fresh id (`t` + 12 hex digits), from which every name in one test derives. */
export function testId(): string {
  return `t${randomBytes(6).toString('hex')}`;
}

/**
 * Opens a connection named `name` (visible in `rabbitmqctl list_connections`), failing
 * loudly with how to start the broker when it is unreachable: tests never skip.
 */
export async function openConnection(name = 'courier-test'): Promise<ChannelModel> {
  try {
    const connection = await connect(BROKER_URL, { clientProperties: { connection_name: name } });
    connection.on('error', () => undefined);
    return connection;
  } catch (error) {
    throw new Error(
      `RabbitMQ is unreachable at ${BROKER_URL} (${String(error)}). Start it with 'rabbitmq-server -detached' ` +
        `and wait with 'rabbitmqctl await_startup', or set COURIER_RABBITMQ_URL.`,
      { cause: error },
    );
  }
}

/** Deletes the queues of `consumers` and the exchange under `prefix`. */
export async function deleteTopology(
  prefix: string,
  consumers: readonly string[],
  tiers: readonly number[] = TEST_TIERS_MS,
  extraQueues: readonly string[] = [],
): Promise<void> {
  const connection = await openConnection(`${prefix}-cleanup`);
  try {
    const channel = await connection.createChannel();
    channel.on('error', () => undefined);
    for (const consumer of consumers) {
      const names = rabbitMqNames(prefix, consumer, tiers);
      for (const queue of [...names.retryQueues.map((t) => t.name), names.queue, names.deadLetterQueue]) await channel.deleteQueue(queue);
    }
    for (const queue of extraQueues) await channel.deleteQueue(queue);
    await channel.deleteExchange(`${prefix}.topics`);
    await channel.close();
  } finally {
    await connection.close().catch(() => undefined);
  }
}

/**
 * Which of `queues` exist on the broker, in the order given. A passive declare of a missing
 * queue closes its channel (404), so each name is checked on a channel of its own.
 */
export async function existingQueues(queues: readonly string[]): Promise<string[]> {
  const connection = await openConnection('courier-test-check');
  try {
    const found: string[] = [];
    for (const queue of queues) {
      const channel = await connection.createChannel();
      channel.on('error', () => undefined);
      try {
        await channel.checkQueue(queue);
        found.push(queue);
        await channel.close();
      } catch (error) {
        if ((error as { code?: unknown }).code !== 404) throw error;
      }
    }
    return found;
  } finally {
    await connection.close().catch(() => undefined);
  }
}

/** Runs `rabbitmqctl` with `args`; returns stdout. */
export async function rabbitmqctl(...args: string[]): Promise<string> {
  const { stdout } = await run('rabbitmqctl', args, { timeout: 120_000 });
  return stdout;
}

/** Closes, from the broker's side, every connection whose client-provided name starts with `namePrefix`. */
export async function closeConnectionsNamed(namePrefix: string): Promise<number> {
  // The tab-separated form prints pids as close_connection wants them (<rabbit@host.N.M.0>);
  // the JSON form does not.
  const out = await rabbitmqctl('list_connections', '-q', '--no-table-headers', 'pid', 'client_properties');
  let closed = 0;
  for (const line of out.split('\n')) {
    const pid = /^(<[^>]+>)\t/.exec(line)?.[1];
    if (pid && line.includes(`{"connection_name","${namePrefix}`)) {
      await rabbitmqctl('close_connection', pid, 'closed by a courier test');
      closed++;
    }
  }
  return closed;
}

/** Polls `check` until it stops throwing (bounded); rethrows its last error after `timeoutMs`. */
export async function eventually<T>(check: () => T | Promise<T>, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await check();
    } catch (error) {
      if (Date.now() >= deadline) throw error;
    }
    await sleep(20);
  }
}
