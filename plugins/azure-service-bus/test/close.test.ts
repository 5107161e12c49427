// `close()` (and so `bus.stop()`) must not wait the SDK's 60 s on a client given up after a
// lost connection. The real-SDK case (transport.test.ts, "ordered consumer cut off") hits it
// only when the cut lands while a settle is in flight (4 of 16 runs); here fake clients put
// it there every time: an ack sent on the first client never gets its answer, as on a cut
// connection, and the client is then given up.
import type { ServiceBusClient, ServiceBusReceivedMessage } from '@azure/service-bus';
import type { Delivery } from '@courier/core';
import { makeEnvelope } from '@courier/conformance';
import { describe, expect, it, vi } from 'vitest';
import { ServiceBusTransport } from '../src/index.js';

const never = () => new Promise<never>(() => {});

/** Resolves with [] after the wait or once aborted, as a receive with nothing to hand out. */
const nothing = (_max: number, options?: { maxWaitTimeInMs?: number; abortSignal?: AbortSignal }) =>
  new Promise<ServiceBusReceivedMessage[]>((resolve) => {
    const timer = setTimeout(() => resolve([]), options?.maxWaitTimeInMs ?? 1_000);
    options?.abortSignal?.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve([]);
    }, { once: true });
  });

/** Whether `promise` settled within `ms` (it never does without the fix: the ack waits forever). */
const settlesWithin = (promise: Promise<unknown>, ms: number): Promise<boolean> =>
  Promise.race([promise.then(() => true, () => true), new Promise<boolean>((resolve) => setTimeout(() => resolve(false), ms))]);

describe('ServiceBusTransport.close after a lost connection', () => {
  it('does not wait for a settle left unanswered on the given-up client: the ack rejects, close resolves', async () => {
    // The message as the transport itself maps an envelope (set below, before any receive).
    const made: { transport?: ServiceBusTransport } = {};
    const message = (): ServiceBusReceivedMessage =>
      ({ ...made.transport!.toMessage(makeEnvelope({ topic: 'orders.placed' })), deliveryCount: 1, sequenceNumber: undefined }) as unknown as ServiceBusReceivedMessage;
    let handedOut = false;
    const clients: { complete: ReturnType<typeof vi.fn> }[] = [];
    const factory = (): ServiceBusClient => {
      // The first client's ack is sent and never answered; later clients have nothing to hand out.
      const complete = vi.fn(clients.length === 0 ? never : async () => undefined);
      clients.push({ complete });
      const receiver = {
        peekMessages: async () => [],
        receiveMessages: (max: number, options?: { maxWaitTimeInMs?: number; abortSignal?: AbortSignal }) => {
          if (clients.length === 1 && !handedOut) {
            handedOut = true;
            return Promise.resolve([message()]);
          }
          return nothing(max, options);
        },
        completeMessage: complete,
        abandonMessage: async () => undefined,
        deadLetterMessage: async () => undefined,
        close: async () => undefined,
      };
      return { createReceiver: () => receiver, createSender: () => ({ close: async () => undefined }), close: async () => undefined } as unknown as ServiceBusClient;
    };
    const transport = new ServiceBusTransport({ client: factory });
    made.transport = transport;
    let acking: Promise<void> | undefined;
    const acked = new Promise<void>((resolve) => {
      void transport.subscribe({ consumer: 'cut', topics: ['orders.placed'], ordered: false, concurrency: 1 }, async (delivery: Delivery) => {
        acking = delivery.ack();
        resolve();
        await acking;
      });
    });
    await acked;
    expect(clients[0]!.complete).toHaveBeenCalledTimes(1);
    // The connection is lost (as the disconnect watch or a failed receive reports it).
    expect(transport.source.lost(0)).toBe(true);
    expect(await settlesWithin(acking!, 5_000), 'the ack on the given-up client stopped waiting').toBe(true);
    await expect(acking).rejects.toThrow(/given up/);
    expect(await settlesWithin(transport.close(), 5_000), 'close() resolved instead of waiting for the unanswered ack').toBe(true);
  });
});
