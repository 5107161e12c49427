// The shop's message and entities, without decorators: shared by the Nest applications of
// the tests (shop.ts) and the worker process the SIGTERM test starts through tsx.
import { defineMessage } from '@courier/core';
import { EntitySchema } from '@mikro-orm/core';
import { z } from 'zod';

export const OrderPlaced = defineMessage('nestshop.OrderPlaced', {
  version: 1,
  schema: z.object({ orderId: z.string(), total: z.number() }),
});

export class ShopOrder {
  constructor(
    readonly id: string,
    readonly total: number,
  ) {}
}
export class ShopPayment {
  constructor(
    readonly messageId: string,
    readonly orderId: string,
  ) {}
}
export const ENTITIES = [
  new EntitySchema<ShopOrder>({ class: ShopOrder, tableName: 'nest_orders', properties: { id: { type: 'string', primary: true }, total: { type: 'number' } } }),
  new EntitySchema<ShopPayment>({ class: ShopPayment, tableName: 'nest_payments', properties: { messageId: { type: 'string', primary: true }, orderId: { type: 'string' } } }),
];

