import { defineMessage } from '@courier/core';
import { z } from 'zod';

const orderPlacedV1 = z.object({
  orderId: z.string().min(1),
  customerId: z.string().min(1),
  totalCents: z.number().int(),
});

const money = z.object({
  // Any integer: refusing a non-positive total is the payments service's business rule,
  // not the contract's, so a bad order reaches the handler and is dead-lettered there.
  amountCents: z.number().int(),
  currency: z.string().length(3),
});

const orderPlacedV2 = z.object({
  orderId: z.string().min(1),
  customerId: z.string().min(1),
  total: money,
});

/**
 * `orders.OrderPlaced`, version 2: the total carries its currency. Version 1 messages
 * (a flat `totalCents`, always euros) are upcast on consume.
 */
export const OrderPlaced = defineMessage('orders.OrderPlaced', {
  version: 2,
  schema: orderPlacedV2,
  upcasters: {
    1: (payload) => {
      const v1 = orderPlacedV1.parse(payload);
      return { orderId: v1.orderId, customerId: v1.customerId, total: { amountCents: v1.totalCents, currency: 'EUR' } };
    },
  },
});

/** `orders.OrderPlaced` as the legacy checkout still publishes it (version 1). */
export const OrderPlacedV1 = defineMessage('orders.OrderPlaced', { version: 1, schema: orderPlacedV1 });

/** `payments.PaymentCaptured`, version 1: a payment was taken for an order. */
export const PaymentCaptured = defineMessage('payments.PaymentCaptured', {
  version: 1,
  schema: z.object({
    paymentId: z.string().min(1),
    orderId: z.string().min(1),
    amountCents: z.number().int().positive(),
    currency: z.string().length(3),
  }),
});
