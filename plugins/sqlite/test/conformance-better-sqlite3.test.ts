import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createBetterSqlite3Fixture } from './support/fixture.js';

describeOutboxStore('better-sqlite3', createBetterSqlite3Fixture);
describeInboxStore('better-sqlite3', createBetterSqlite3Fixture);
