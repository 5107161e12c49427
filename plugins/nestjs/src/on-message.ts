import 'reflect-metadata';
import type { DecodedOf, HandlerContext, MessageDefinition, ReceivedMessage, SubscribeOptions } from '@courier/core';

/** Options of {@link OnMessage}: the consumer (group) and its subscription options. */
export interface OnMessageOptions extends SubscribeOptions {
  /**
   * The consumer (group) name: every consumer gets its own copy of each message and its own
   * inbox records. Defaults to the module's `defaultConsumer`; bootstrap fails when neither
   * is set.
   */
  readonly consumer?: string;
  /** The bus (`CourierModule.forRoot({ name })`) the handler subscribes on. Default `'default'`. */
  readonly bus?: string;
}

/** One `@OnMessage` of a method, as discovery reads it. */
export interface OnMessageMetadata {
  readonly definition: MessageDefinition<unknown, unknown>;
  readonly options: OnMessageOptions;
}

/** The reflect-metadata key under which a method's `@OnMessage` list is kept. */
export const ON_MESSAGE_METADATA = 'courier:on-message';

/** The method shape `@OnMessage(definition)` accepts; `ctx.tx` is your stores' unit of work. */
export type OnMessageMethod<D> = (message: ReceivedMessage<DecodedOf<D>>, context: HandlerContext<never>) => Promise<void>;

/**
 * Marks a provider's method as the handler of `definition` for a consumer. The provider is
 * discovered when the application bootstraps and subscribed before the bus starts; the
 * method runs on the provider instance, with its injected dependencies, and is called as
 * `bus.subscribe` handlers are: `(message, ctx)`, effects written through `ctx.tx` commit
 * with the inbox record (exactly once per message and consumer), throwing retries,
 * `UnrecoverableError` dead-letters at once.
 *
 * Guarantees, checked at bootstrap (the application fails to start with a `ConfigError`
 * naming the method and the fix): the method has a consumer name; one consumer has one
 * handler per message type; handlers of one consumer do not set its options
 * (`ordered`, `concurrency`, `poison`, …) differently; the provider is a singleton (a
 * request-scoped or transient provider has no instance outside a request); the bus named
 * in `bus` exists. Options apply to the whole consumer, as with `bus.subscribe`.
 *
 * A method may carry several `@OnMessage` (one per type or consumer). Put `@OnMessage`
 * above any decorator that replaces the method, so it marks the method that runs.
 */
export function OnMessage<D extends MessageDefinition<unknown, unknown>>(definition: D, options: OnMessageOptions = {}) {
  return <T extends OnMessageMethod<D>>(target: object, key: string | symbol, descriptor: TypedPropertyDescriptor<T>): void => {
    const method = descriptor.value;
    if (typeof method !== 'function') throw new TypeError(`@OnMessage decorates methods only ('${String(key)}' is not one)`);
    const list = (Reflect.getOwnMetadata(ON_MESSAGE_METADATA, method) as OnMessageMetadata[] | undefined) ?? [];
    Reflect.defineMetadata(ON_MESSAGE_METADATA, [...list, { definition, options: { ...options } }], method);
    void target;
  };
}

/** The `@OnMessage` list of a method, empty when it has none. */
export function onMessageMetadata(method: unknown): readonly OnMessageMetadata[] {
  if (typeof method !== 'function') return [];
  return (Reflect.getOwnMetadata(ON_MESSAGE_METADATA, method) as OnMessageMetadata[] | undefined) ?? [];
}
