import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createLibsqlFixture } from './support/fixture.js';

describeOutboxStore('libsql', createLibsqlFixture);
describeInboxStore('libsql', createLibsqlFixture);
