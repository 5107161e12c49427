import { describeTransport } from '@courier/conformance';
import { createSqlTransportFixture } from './support/fixture.js';

describeTransport('sql-sqlite', createSqlTransportFixture('sqlite'), { timeoutMs: 20_000 });
