import { describeTransport } from '@courier/conformance';
import { createSqlTransportFixture } from './support/fixture.js';

describeTransport('sql-mariadb', createSqlTransportFixture('mariadb'), { timeoutMs: 20_000 });
