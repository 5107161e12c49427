// The single active instance of an ordered group: a lease message per group in a stream
// that keeps one message per subject, written with an expected last sequence, so of two
// instances racing for it exactly one wins (JetStream's compare-and-set on a subject).
import type { Connection } from './topology.js';
import { describe } from './nats-mapping.js';

/** A held lease: the sequence of our lease message and when it runs out unless renewed. */
export interface HeldLease {
  readonly seq: number;
  readonly until: number;
}

/** Takes the group's lease when it is free, ours or run out; undefined while another instance holds it. */
export async function acquireLease(connection: Connection, leaseStream: string, subject: string, instance: string, leaseMs: number): Promise<HeldLease | undefined> {
  const last = await connection.jsm.streams.getMessage(leaseStream, { last_by_subj: subject }).catch((error: unknown) => {
    if (/no message found|not found/i.test(describe(error))) return null;
    throw error;
  });
  let lastSeq = 0;
  if (last) {
    lastSeq = last.seq;
    const record = JSON.parse(new TextDecoder().decode(last.data) || '{}') as { holder?: string; until?: number };
    if (record.holder && record.holder !== instance && (record.until ?? 0) > Date.now()) return undefined;
  }
  return writeLease(connection, subject, instance, lastSeq, leaseMs);
}

/** Extends a held lease; undefined when another instance wrote it meanwhile (the lease is lost). */
export async function renewLease(connection: Connection, subject: string, instance: string, seq: number, leaseMs: number): Promise<HeldLease | undefined> {
  return writeLease(connection, subject, instance, seq, leaseMs);
}

async function writeLease(connection: Connection, subject: string, instance: string, expected: number, leaseMs: number): Promise<HeldLease | undefined> {
  const until = Date.now() + leaseMs;
  try {
    const ack = await connection.js.publish(subject, new TextEncoder().encode(JSON.stringify({ holder: instance, until })), { expect: { lastSubjectSequence: expected } });
    return { seq: ack.seq, until };
  } catch (error) {
    if (/wrong last sequence|10071/i.test(describe(error))) return undefined;
    throw error;
  }
}

/** Gives the lease up at once (a closing subscription), so the next holder need not wait for it to run out. */
export async function releaseLease(connection: Connection, subject: string, seq: number): Promise<void> {
  await connection.js.publish(subject, new TextEncoder().encode('{}'), { expect: { lastSubjectSequence: seq } });
}
