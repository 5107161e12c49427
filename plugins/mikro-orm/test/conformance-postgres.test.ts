import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createPostgresFixture } from './support/fixture.js';

describeOutboxStore('mikro-orm:postgresql', createPostgresFixture);
describeInboxStore('mikro-orm:postgresql', createPostgresFixture);
