import { describeOutboxStore } from '@courier/conformance';
import { createMariaDbDeletingFixture, createPostgresDeletingFixture, createSqliteDeletingFixture } from './support/fixture.js';

// The whole outbox contract again with `publishedRows: 'delete'` (completion deletes the rows
// instead of marking them published). The fixtures declare it (`outboxPublishedRows`), so the
// cases that depend on kept published rows hold the store to the deleting expectation.
describeOutboxStore('mikro-orm:postgresql, publishedRows delete', createPostgresDeletingFixture);
describeOutboxStore('mikro-orm:mariadb, publishedRows delete', createMariaDbDeletingFixture);
describeOutboxStore('mikro-orm:sqlite, publishedRows delete', createSqliteDeletingFixture);
