// Published state as TypeScript users write it (README "Published state"): `tsc --noEmit` must pass.
import { ProsodyClient, PublishedDeque, PublishedMap, PublishedValue, deque, map, messageValue,
         value } from '@prosody-events/prosody';

interface Order { total: number }

// The owner publishes; a reader names the owner's subsystem.
const totals = value<number>('totals', { published: true });
const orders = map<Order>('orders', { published: true, keysetLimit: 256 });
const recent = deque<string>('recent', { published: true, capacity: 10 });
void new ProsodyClient({ subsystem: 'billing', groupId: 'g', subscribedTopics: 't',
                         stateCollections: [totals, orders, recent] });

async function read(): Promise<void> {
  const client = await ProsodyClient.create({ stateReadCache: { ttlMs: 1000 } });
  void new ProsodyClient({ stateReadCache: { disabled: true } });
  void new ProsodyClient({ stateReadCache: 'none' });
  const v: PublishedValue<number> = await client.state('billing', value<number>('totals'));
  const m: PublishedMap<Order> = await client.state('billing', map<Order>('orders', { readCache: false }));
  const d: PublishedDeque<string> = await client.state('billing',
                                                       deque<string>('recent', { readCache: { ttlMs: 50 } }));
  const n: number | null = await v.get('customer-1');
  const o: Order | null = await m.get('customer-1', 'order-7');
  const many: (Order | null)[] = await m.getMany('customer-1', ['a', 'b']);
  const has: boolean = await m.has('customer-1', 'a');
  for await (const [key, order] of m.entries('customer-1', 'backward')) console.log(key, order.total);
  for await (const key of m.keys('customer-1')) console.log(key);
  for await (const order of m.values('customer-1')) console.log(order.total);
  const length: number = await d.length('customer-1');
  const empty: boolean = await d.isEmpty('customer-1');
  const last: string | null = await d.at('customer-1', -1);
  for await (const page of d.values('customer-1', 'forward')) console.log(page);
  console.log(n, o, many, has, length, empty, last, v.subsystem, m.name);
  // @ts-expect-error: message collections are not published
  await client.state('billing', messageValue('last'));
}

void read;
