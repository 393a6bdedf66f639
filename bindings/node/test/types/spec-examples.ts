// The spec's examples as TypeScript users write them: `tsc --noEmit` must pass.
import { AdminClient, ConsumerState, Context, Logger, Message, Mode, PermanentError, ProsodyClient,
         Timer, permanent } from '@prosody-events/prosody';

const client = new ProsodyClient({
  bootstrapServers: 'localhost:9092',
  sourceSystem: 'my-application-source',
  groupId: 'my-consumer-group',
  subscribedTopics: 'my-topic',
  timeoutMs: 30000,
  stallThresholdMs: 60000,
  probePort: null,
  mode: Mode.LowLatency,
  failureTopic: 'failed-messages',
  allowedEvents: ['user.', 'account.'],
});

// An unparameterized Message's payload is a JsonValue (as in the original's types): reading a
// field of it takes the payload's type.
const messageHandler = {
  onMessage: async (context: Context, message: Message<{ scheduleFollowup?: boolean }>, signal: AbortSignal) => {
    console.log(`Received message: ${JSON.stringify(message)}`);
    if (message.payload.scheduleFollowup) {
      await context.schedule(new Date(Date.now() + 30000));
    }
    const scheduled: Date[] = await context.scheduled();
    console.log(scheduled.length, context.shouldCancel, signal.aborted);
    await client.send('topic', 'key', { data: 'value' }, signal);
  },
  onTimer: async (context: Context, timer: Timer, signal: AbortSignal) => {
    console.log(`Timer fired for key: ${timer.key} at ${timer.time.toISOString()}`);
    await context.clearAndSchedule(new Date(timer.time.getTime() + 60000));
    await context.unschedule(timer.time);
    await context.clearScheduled();
    await context.onCancel();
  },
};

class MyHandler {
  @permanent(TypeError, RangeError)
  async onMessage(context: Context, message: Message, signal: AbortSignal): Promise<void> {
    if (!message.key) throw new PermanentError('no key');
  }
}

async function main(): Promise<void> {
  client.subscribe(messageHandler);
  await client.subscribe(new MyHandler());
  await client.send('my-topic', 'message-key', { content: 'Hello, Kafka!' });
  const state: ConsumerState = await client.consumerState();
  console.log(state === ConsumerState.Running, client.sourceSystem, await client.isStalled(),
              await client.assignedPartitionCount());
  await client.unsubscribe();
  const admin = new AdminClient('localhost:9092');
  await admin.createTopic('test-topic', 4, 1);
  await admin.createTopic('other', { partitionCount: 4, cleanupPolicy: 'delete', retention: 604800000 });
  await admin.deleteTopic('test-topic');
}

// The `logger` option (not in the spec): console, or any console-compatible logger.
const logged: string[] = [];
const logger: Logger = {
  error: (m) => logged.push(m), warn: (m) => logged.push(m), info: (m) => logged.push(m),
  debug: (m) => logged.push(m),
};
new ProsodyClient({ mock: true, sourceSystem: 'logs', log: 'debug', logger });
new ProsodyClient({ mock: true, sourceSystem: 'logs', logger: console });

main().catch(console.error);
