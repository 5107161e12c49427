// A courier.config.ts whose only part is an SQS transport (plugins/aws, imported by path: the
// CLI package does not depend on it), for the SQS dead-letter listing through the binary. The
// queue prefix, FIFO mode and consumers come from env vars.
import { createRequire } from 'node:module';
import { defineCourierConfig } from '@courier/cli';
import { SqsTransport, type SqsTransportConfig } from '../../../../plugins/aws/src/index.js';

/** The SDK's client as the plugin resolves it (the CLI package has no dependency on the SDK). */
export const { SQSClient } = createRequire(new URL('../../../../plugins/aws/package.json', import.meta.url))('@aws-sdk/client-sqs') as {
  SQSClient: new (config: { endpoint: string; region: string; credentials: { accessKeyId: string; secretAccessKey: string } }) => SqsTransportConfig['client'] & { destroy(): void };
};

export default defineCourierConfig(() => {
  const client = new SQSClient({
    endpoint: process.env['COURIER_SQS_ENDPOINT'] ?? 'http://127.0.0.1:9324',
    region: 'us-east-1',
    credentials: { accessKeyId: 'test', secretAccessKey: 'test' },
  });
  const transport = new SqsTransport({ client, prefix: process.env['CLI_TEST_SQS_PREFIX']!, fifo: process.env['CLI_TEST_SQS_FIFO'] === '1', provision: false });
  return {
    transport,
    consumers: (process.env['CLI_TEST_CONSUMERS'] ?? '').split(',').filter(Boolean),
    async close() {
      await transport.close();
      client.destroy();
    },
  };
});
