import type { DeliveryHandler, Endpoint, Subscription, Transport } from '@courier/core';

/**
 * `transport` with its `subscribe` replaced by `subscribe` (which usually calls through with
 * a wrapped handler); every other member passes through unchanged, the optional ones only
 * when the transport has them. For bus cases that stage what a broker does to deliveries.
 */
export function withSubscribe(transport: Transport, subscribe: (endpoint: Endpoint, handler: DeliveryHandler) => Promise<Subscription>): Transport {
  return {
    capabilities: transport.capabilities,
    publish: (messages, options) => transport.publish(messages, options),
    subscribe,
    ...(transport.deadLetters ? { deadLetters: transport.deadLetters } : {}),
    close: () => transport.close(),
    ...(transport.limits ? { limits: transport.limits } : {}),
    ...(transport.validate ? { validate: transport.validate.bind(transport) } : {}),
  };
}
