import { makeEnvelope, uniqueId } from '@courier/conformance';
import type { ClaimedBatch, Envelope } from '@courier/core';
import type { MikroOrmFixture } from './fixture.js';

/** A fresh envelope on `topic`. */
export function envelope(topic: string, key: string | null = null, overrides: Partial<Envelope> = {}): Envelope {
  return makeEnvelope({ topic, key, type: 'mikroorm.Tested', ...overrides });
}

/** Claims everything due (long lease, head of key). */
export function claimAll(fixture: MikroOrmFixture, owner = 'relay'): Promise<ClaimedBatch> {
  return fixture.outbox.claim({ owner, limit: 1_000, leaseMs: 60_000, perKey: 1 });
}

/** messageIds of a batch, sorted. */
export function idsOf(batch: ClaimedBatch): string[] {
  return batch.records.map((record) => record.envelope.messageId).sort();
}

/** A fresh test id. */
export function testId(): string {
  return uniqueId();
}
