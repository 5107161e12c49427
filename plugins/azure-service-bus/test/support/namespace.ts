// Where the tests run: the in-process stand-in (default), or a real namespace or the
// official emulator when COURIER_ASB_CONNECTION_STRING is set. On a real one the entities
// are provisioned through the administration API (provisioning.ts), named after each
// test's unique id, and the topics and queues this process created are deleted after the
// test file (afterAll); auto-delete-on-idle removes what a killed run or worker left.
import { ServiceBusAdministrationClient } from '@azure/service-bus';
import { Provisioner, namespaceLockMs } from './provisioning.js';
import { STANDIN_LOCK_MS } from './standin-server.js';

/** The connection string of a real namespace or emulator; undefined: the stand-in. */
export const REAL_CONNECTION_STRING: string | undefined = process.env['COURIER_ASB_CONNECTION_STRING'] || undefined;

/** Whether this run talks to a real namespace (or the official emulator) instead of the stand-in. */
export const onRealNamespace = REAL_CONNECTION_STRING !== undefined;

/** Lock duration of the tests' entities: a namespace accepts no less than 5 s. */
export const LOCK_MS = onRealNamespace ? namespaceLockMs(STANDIN_LOCK_MS) : STANDIN_LOCK_MS;

let provisioner: Provisioner | undefined;

/** The provisioner of this process (real namespace only), for the transport tests' entities. */
export function realProvisioner(): Provisioner | undefined {
  if (!REAL_CONNECTION_STRING) return undefined;
  provisioner ??= new Provisioner(new ServiceBusAdministrationClient(REAL_CONNECTION_STRING), {
    lockDurationMs: LOCK_MS,
    maxDeliveryCount: 100,
    duplicateDetection: true,
    autoDeleteOnIdleMs: 10 * 60_000,
  });
  return provisioner;
}

/** Deletes what this process provisioned (an afterAll of each test file); a no-op on the stand-in. */
export async function cleanupNamespace(): Promise<void> {
  const failures = (await provisioner?.cleanup()) ?? [];
  // Left for auto-delete-on-idle; said, so an operator knows.
  for (const failure of failures) console.warn(`[azure-service-bus] could not delete ${failure}`);
}

/** Says once per file that a stand-in-only case is skipped on a real namespace, and why. */
export function skipOnRealNamespace(why: string): boolean {
  if (onRealNamespace) console.log(`[azure-service-bus] skipped on a real namespace: ${why}`);
  return onRealNamespace;
}
