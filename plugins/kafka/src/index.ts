export type { KafkaTransportConfig } from './kafka-transport.js';
export { KafkaTransport } from './kafka-transport.js';
export { HEADERS as KAFKA_HEADERS } from './record-codec.js';
