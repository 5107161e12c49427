export type { SqsTransportConfig } from './sqs-transport.js';
export { SqsTransport } from './sqs-transport.js';
export type { DeadMark } from './sqs-mapping.js';
export { ATTRIBUTES, ATTRIBUTE_ROOM_BYTES, SQS_MESSAGE_BYTES } from './sqs-mapping.js';
export type { RelayOnceOptions, RelayOnceSummary, SqsBatchResponse, SqsEvent, SqsEventRecord } from './lambda.js';
export { SqsEventSource, relayOnce } from './lambda.js';
