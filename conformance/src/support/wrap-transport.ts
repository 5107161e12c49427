import type { Delivery, DeliveryHandler, Endpoint, Subscription, Transport } from '@courier/core';

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

/**
 * `delivery` with its settles replaced by `settles` (which usually call through to it and
 * record or stage something); what it carries — envelope, attempt, the redelivered and
 * replayed flags — passes through unchanged. For bus cases that watch or stage settles.
 */
export function withSettles(delivery: Delivery, settles: Pick<Delivery, 'ack' | 'retry' | 'deadLetter'>): Delivery {
  return {
    envelope: delivery.envelope,
    attempt: delivery.attempt,
    redelivered: delivery.redelivered,
    ...(delivery.replayed !== undefined ? { replayed: delivery.replayed } : {}),
    ...settles,
  };
}
