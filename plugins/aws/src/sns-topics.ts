import type { PublishBatchCommandOutput, PublishBatchRequestEntry, SNSClient } from '@aws-sdk/client-sns';

type SnsModule = typeof import('@aws-sdk/client-sns');

/** The statement id of the queue-policy statement Courier owns (other statements are kept). */
export const POLICY_SID = 'courier-sns-send';

/**
 * The SNS calls of the SNS → SQS mode. `@aws-sdk/client-sns` is an optional peer: it is
 * loaded on first use, so SQS-only users need not install it.
 */
export class SnsTopics {
  #module: Promise<SnsModule> | undefined;

  constructor(readonly client: SNSClient) {}

  #load(): Promise<SnsModule> {
    this.#module ??= import('@aws-sdk/client-sns');
    return this.#module;
  }

  /**
   * Creates the topic or returns the existing one's ARN: CreateTopic is idempotent for the
   * same attributes (https://docs.aws.amazon.com/sns/latest/api/API_CreateTopic.html); a
   * topic made elsewhere with other attributes (say ContentBasedDeduplication) is refused
   * there, and then looked up and used as it is.
   */
  async create(name: string, fifo: boolean): Promise<string> {
    const { CreateTopicCommand } = await this.#load();
    try {
      return (await this.client.send(new CreateTopicCommand({ Name: name, ...(fifo ? { Attributes: { FifoTopic: 'true' } } : {}) }))).TopicArn!;
    } catch (error) {
      if ((error as { name?: string }).name !== 'InvalidParameterException') throw error;
      const found = await this.find(name);
      if (found === undefined) throw error;
      return found;
    }
  }

  /** The ARN of the topic named `name`, or undefined: ListTopics, page by page (a read creates nothing). */
  async find(name: string): Promise<string | undefined> {
    const { ListTopicsCommand } = await this.#load();
    let token: string | undefined;
    do {
      const page = await this.client.send(new ListTopicsCommand(token === undefined ? {} : { NextToken: token }));
      const found = page.Topics?.find((topic) => topic.TopicArn?.split(':').at(-1) === name);
      if (found?.TopicArn !== undefined) return found.TopicArn;
      token = page.NextToken;
    } while (token !== undefined);
    return undefined;
  }

  /** The ARN of the `sqs` subscription of `topicArn` to `queueArn`, or undefined. */
  async subscriptionOf(topicArn: string, queueArn: string): Promise<string | undefined> {
    const { ListSubscriptionsByTopicCommand } = await this.#load();
    let token: string | undefined;
    do {
      const page = await this.client.send(new ListSubscriptionsByTopicCommand({ TopicArn: topicArn, ...(token === undefined ? {} : { NextToken: token }) }));
      const found = page.Subscriptions?.find((subscription) => subscription.Protocol === 'sqs' && subscription.Endpoint === queueArn);
      if (found?.SubscriptionArn !== undefined) return found.SubscriptionArn;
      token = page.NextToken;
    } while (token !== undefined);
    return undefined;
  }

  /**
   * Subscribes the queue with raw message delivery (idempotent: the same subscription's ARN
   * comes back, https://docs.aws.amazon.com/sns/latest/api/API_Subscribe.html). A
   * subscription that exists without raw delivery is refused there and reported by
   * {@link isRaw}, never changed: it is the user's.
   */
  async subscribe(topicArn: string, queueArn: string): Promise<string> {
    const { SubscribeCommand } = await this.#load();
    try {
      return (await this.client.send(new SubscribeCommand({ TopicArn: topicArn, Protocol: 'sqs', Endpoint: queueArn, Attributes: { RawMessageDelivery: 'true' }, ReturnSubscriptionArn: true }))).SubscriptionArn!;
    } catch (error) {
      if ((error as { name?: string }).name !== 'InvalidParameterException') throw error;
      const found = await this.subscriptionOf(topicArn, queueArn);
      if (found === undefined) throw error;
      return found;
    }
  }

  /** Whether a subscription delivers raw messages (the body is the message, attributes are SQS attributes). */
  async isRaw(subscriptionArn: string): Promise<boolean> {
    const { GetSubscriptionAttributesCommand } = await this.#load();
    const attributes = (await this.client.send(new GetSubscriptionAttributesCommand({ SubscriptionArn: subscriptionArn }))).Attributes ?? {};
    return attributes['RawMessageDelivery'] === 'true';
  }

  async publishBatch(topicArn: string, entries: PublishBatchRequestEntry[]): Promise<PublishBatchCommandOutput> {
    const { PublishBatchCommand } = await this.#load();
    return this.client.send(new PublishBatchCommand({ TopicArn: topicArn, PublishBatchRequestEntries: entries }));
  }
}

/**
 * A queue policy that lets `topicArns` send to the queue, as AWS requires for an SNS → SQS
 * subscription (https://docs.aws.amazon.com/sns/latest/dg/subscribe-sqs-queue-to-sns-topic.html):
 * the statement {@link POLICY_SID} is Courier's and grows by the topics it already names;
 * every other statement of `current` is kept.
 */
export function queuePolicy(current: string | undefined, queueArn: string, topicArns: readonly string[]): string {
  interface Statement {
    Sid?: string;
    Condition?: { ArnEquals?: { 'aws:SourceArn'?: string | string[] } };
    [key: string]: unknown;
  }
  let policy: { Version?: string; Statement?: Statement[]; [key: string]: unknown } = {};
  try {
    policy = current ? (JSON.parse(current) as typeof policy) : {};
  } catch {
    policy = {};
  }
  const statements = Array.isArray(policy.Statement) ? policy.Statement : [];
  const ours = statements.find((statement) => statement.Sid === POLICY_SID);
  const before = ours?.Condition?.ArnEquals?.['aws:SourceArn'];
  const sources = [...new Set([...(Array.isArray(before) ? before : before === undefined ? [] : [before]), ...topicArns])].sort();
  const statement: Statement = {
    Sid: POLICY_SID,
    Effect: 'Allow',
    Principal: { Service: 'sns.amazonaws.com' },
    Action: 'sqs:SendMessage',
    Resource: queueArn,
    Condition: { ArnEquals: { 'aws:SourceArn': sources } },
  };
  return JSON.stringify({ ...policy, Version: policy.Version ?? '2012-10-17', Statement: [...statements.filter((other) => other.Sid !== POLICY_SID), statement] });
}
