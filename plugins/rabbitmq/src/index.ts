export type { RabbitMqTransportConfig, RabbitMqTransportStats } from './rabbitmq-transport.js';
export { RabbitMqTransport } from './rabbitmq-transport.js';
export type { RabbitMqNames, RabbitMqQueueLimits } from './topology.js';
export { DEFAULT_DELAY_TIERS_MS, chooseDelayTier, rabbitMqNames } from './topology.js';
export type { AmqpIncoming, AmqpMessage, AmqpPublishProperties } from './amqp-mapping.js';
export { COURIER_HEADERS, attemptOf, fromAmqpMessage, toAmqpMessage } from './amqp-mapping.js';
export { RabbitMqDeadLetters } from './rabbitmq-dead-letters.js';
