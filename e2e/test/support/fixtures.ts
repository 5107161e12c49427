// The end-to-end fixtures reuse the plugins' own conformance fixtures: PostgreSQL through
// MikroORM, and RabbitMQ, each with names private to the test id.
import type { FixtureContext, StoreFixture, TransportFixture } from '@courier/conformance';
import type { EntityManager } from '@mikro-orm/core';
import { createPostgresFixture } from '../../../plugins/mikro-orm/test/support/fixture.js';
import { createRabbitMqFixture } from '../../../plugins/rabbitmq/test/support/fixture.js';

export { createPostgresFixture, createRabbitMqFixture };

/** vitest's timeout of a restart case (each case passes it explicitly, so the deadline below cannot drift from it). */
export const RESTART_CASE_TIMEOUT_MS = 180_000;

/**
 * The deadline of a restart case that begins now: `marginMs` before vitest's timeout, kept
 * for what the case does after the run (its assertions, its own cleanup). Cut to it, a
 * run that hangs ends with the kit's diagnosis (the step that hung, where each unsettled
 * message is) instead of vitest's bare "Test timed out".
 */
export function restartCaseDeadline(marginMs: number): number {
  return Date.now() + RESTART_CASE_TIMEOUT_MS - marginMs;
}

/** A PostgreSQL store fixture. */
export const postgresStore = (context: FixtureContext): Promise<StoreFixture<EntityManager>> => createPostgresFixture(context);

/**
 * Publish timeout of the end-to-end RabbitMQ transports. The bus requires a relay lease of
 * at least twice the timeout the transport declares (this plus a quarter: 750 ms), and the
 * scenarios run with a 1.5 s lease (`DEFAULT_TUNING.leaseMs`).
 */
export const E2E_PUBLISH_TIMEOUT_MS = 600;

/**
 * Largest payload of the end-to-end RabbitMQ transports: one such message (and its
 * dead-letter copy, in the kit's oversized dead-letter case) must be confirmed within the
 * short publish timeout on a loaded machine, which 16 MiB (the default) never was.
 */
export const E2E_MAX_MESSAGE_BYTES = 1024 * 1024;

/** A RabbitMQ transport fixture whose outage cuts only its own connections (safe beside other tests). */
export const rabbitMqTransport = (context: FixtureContext): Promise<TransportFixture> =>
  createRabbitMqFixture(context, { outage: 'network', config: { publishTimeoutMs: E2E_PUBLISH_TIMEOUT_MS, maxMessageBytes: E2E_MAX_MESSAGE_BYTES } });

/** A Kafka transport fixture (plugins/kafka): its outage cuts only its own connections, through TCP proxies. */
export { createKafkaFixture as kafkaTransport } from '../../../plugins/kafka/test/support/fixture.js';
