import { describeTransport } from '@courier/conformance';
import { createSqlTransportFixture } from './support/fixture.js';

describeTransport('sql-postgresql', createSqlTransportFixture('postgresql'), { timeoutMs: 20_000 });
