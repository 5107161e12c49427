import { fileURLToPath } from 'node:url';
import { describeBus } from '@courier/conformance';
import { createSqliteStoreFixture } from '@courier/mikro-orm/conformance';
import { createRedisStreamsFixture } from './support/fixture.js';

describeBus('redis-streams', { store: createSqliteStoreFixture, transport: createRedisStreamsFixture }, {
  inProcess: 'throw',
  // Workers run the workspace packages from source, like vitest does: without the condition
  // Node resolves @courier/* to dist/, which exists only after `pnpm build`.
  process: { module: fileURLToPath(new URL('./support/bus-process-fixture.ts', import.meta.url)), execArgv: ['--conditions=@courier/source'] },
});
