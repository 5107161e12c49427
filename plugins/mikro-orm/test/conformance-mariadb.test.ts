import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createMariaDbFixture } from './support/fixture.js';

describeOutboxStore('mikro-orm:mariadb', createMariaDbFixture);
describeInboxStore('mikro-orm:mariadb', createMariaDbFixture);
