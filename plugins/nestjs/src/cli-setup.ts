import type { CourierCliSetup, SchemaAdmin } from '@courier/cli';
import type { CourierModuleOptions } from './courier-module-options.js';

/** What the CLI needs besides the module's options. */
export interface CourierCliSetupOptions {
  /**
   * The consumer names whose dead letters `courier dead` looks at (your `@OnMessage`
   * consumers): a transport keeps dead letters per consumer and cannot list them.
   */
  readonly consumers?: readonly string[];
  /** Schema status and migration for `courier migrate` (`courierSchemaAdmin` of `@courier/mikro-orm/migrations`). */
  readonly schema?: SchemaAdmin;
}

/**
 * The `courier` CLI's setup from the same options object `CourierModule.forRoot` /
 * `forRootAsync` use, so `courier.config.ts` is three lines:
 *
 * ```ts
 * export default defineCourierConfig(async () => courierCliSetup(await courierOptions(), { consumers: ['payments'] }));
 * ```
 *
 * with `courierOptions()` the function your `forRootAsync({ useFactory })` calls. The CLI
 * gets the same stores and transport, `courier relay` the same relay settings and
 * `onKeyHalted`, and the options' `close` runs when the command ends. The module-only
 * options (`start`, `stop`, `defaultConsumer`) are not used.
 */
export function courierCliSetup(options: CourierModuleOptions, extra: CourierCliSetupOptions = {}): CourierCliSetup {
  return {
    outbox: options.outbox,
    ...(options.inbox ? { inbox: options.inbox } : {}),
    transport: options.transport,
    ...(extra.consumers ? { consumers: extra.consumers } : {}),
    ...(extra.schema ? { schema: extra.schema } : {}),
    relay: () => ({
      outbox: options.outbox,
      transport: options.transport,
      ...(options.relay ? { relay: options.relay } : {}),
      ...(options.onKeyHalted ? { onKeyHalted: options.onKeyHalted } : {}),
    }),
    ...(options.close ? { close: options.close } : {}),
  };
}
