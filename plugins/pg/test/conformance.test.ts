import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createPgFixture } from './support/pg-fixture.js';

describeOutboxStore('pg', (context) => createPgFixture(context));
describeInboxStore('pg', (context) => createPgFixture(context));
