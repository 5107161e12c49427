export { RedisStreamsTransport, type RedisStreamsTransportConfig } from './redis-streams-transport.js';
export { RedisStreamsDeadLetters } from './redis-streams-dead-letters.js';
export { StreamKeys } from './stream-keys.js';
export type { RedisClientFactory } from './redis-connections.js';
