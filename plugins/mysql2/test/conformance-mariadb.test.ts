import { describeInboxStore, describeOutboxStore } from '@courier/conformance';
import { createMysql2Fixture } from './support/fixture.js';

describeOutboxStore('mysql2:mariadb', createMysql2Fixture);
describeInboxStore('mysql2:mariadb', createMysql2Fixture);
