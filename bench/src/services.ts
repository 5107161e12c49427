import { connect } from 'amqplib';
import { createConnection } from 'node:net';
import type { ServiceName } from './options.js';

/** Where the services are (the same variables and defaults as the plugins' tests). */
export const URLS: Readonly<Record<ServiceName, string>> = {
  postgresql: process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test',
  mariadb: process.env['COURIER_MARIADB_URL'] ?? 'mysql://root@127.0.0.1:3306/test',
  rabbitmq: process.env['COURIER_RABBITMQ_URL'] ?? 'amqp://guest:guest@127.0.0.1:5672',
};

const HOW_TO_START: Readonly<Record<ServiceName, string>> = {
  postgresql: 'start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, or point COURIER_PG_URL at one',
  mariadb:
    'start it with `install -d -o mysql -g mysql /run/mysqld; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql` ' +
    '(wait with `mariadb-admin ping`), or point COURIER_MARIADB_URL at one',
  rabbitmq: 'start it with `rabbitmq-server -detached && rabbitmqctl await_startup`, or point COURIER_RABBITMQ_URL at one',
};

/**
 * Checks that a requested service answers; throws with how to start it otherwise. A TCP
 * connect for the databases (the ORM then reports credentials problems itself), a real
 * AMQP handshake for RabbitMQ.
 */
export async function checkService(service: ServiceName): Promise<void> {
  const url = URLS[service];
  try {
    if (service === 'rabbitmq') {
      const connection = await connect(url);
      await connection.close();
      return;
    }
    const parsed = new URL(url);
    const port = Number(parsed.port || (service === 'postgresql' ? 5432 : 3306));
    await new Promise<void>((resolve, reject) => {
      const socket = createConnection({ host: parsed.hostname, port, timeout: 3_000 });
      socket.once('connect', () => {
        socket.end();
        resolve();
      });
      socket.once('timeout', () => {
        socket.destroy();
        reject(new Error('connect timed out'));
      });
      socket.once('error', reject);
    });
  } catch (error) {
    throw new Error(`${service} at ${redact(url)} is unreachable (${error instanceof Error ? error.message : String(error)}): ${HOW_TO_START[service]}`, { cause: error });
  }
}

/** The URL without its password, for messages. */
export function redact(url: string): string {
  return url.replace(/\/\/([^:/@]+):[^@]*@/, '//$1:***@');
}
