// The courier.config.ts of the shop: the CLI's setup from the same options function the
// Nest module uses (courier-options.ts), for the test's schema and prefix (env vars).
import { defineCourierConfig } from '@courier/cli';
import type { MikroORM as CoreMikroORM } from '@mikro-orm/core';
import { MikroORM } from '@mikro-orm/postgresql';
import { courierCliSetup } from '../../src/cli-setup.js';
import { shopCourierOptions } from './courier-options.js';

export default defineCourierConfig(async () => {
  const schema = process.env['NEST_TEST_SCHEMA'];
  const prefix = process.env['NEST_TEST_PREFIX'];
  if (!schema || !prefix) throw new Error('set NEST_TEST_SCHEMA and NEST_TEST_PREFIX');
  const orm = await MikroORM.init({ clientUrl: process.env['COURIER_PG_URL'] ?? 'postgres://postgres@127.0.0.1:5432/test', schema, entities: [], discovery: { warnWhenNoEntities: false } });
  const options = shopCourierOptions(orm as unknown as CoreMikroORM, { schema, prefix });
  return courierCliSetup(
    {
      ...options,
      close: async () => {
        await options.close?.();
        await orm.close();
      },
    },
    { consumers: ['payments'] },
  );
});
