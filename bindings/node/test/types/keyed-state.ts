// Keyed state as TypeScript users write it (README "Keyed state"): `tsc --noEmit` must pass.
import { Context, DequeState, MapState, Message, ProsodyClient, TransientStateError, ValueState, deque,
         isStateError, map, value } from '@prosody-events/prosody';

interface Visit { page: string; at: number }

const visits = value<number>('visits', { ttlSeconds: 86400 });
const pages = map<Visit>('pages', { keysetLimit: 256 });
const recent = deque<string>('recent', { capacity: 10 });

const client = new ProsodyClient({ groupId: 'g', subscribedTopics: 't', stateCollections: [visits, pages, recent] });

async function onMessage(context: Context, message: Message<{ page: string }>): Promise<void> {
  const count: ValueState<number> = context.state(visits);
  const byPage: MapState<Visit> = context.state(pages);
  const lastPages: DequeState<string> = context.state(recent);
  const n: number | null = await count.get();
  await count.set((n ?? 0) + 1);
  await byPage.set(message.payload.page, { page: message.payload.page, at: Date.now() });
  const many: (Visit | null)[] = await byPage.getMany(['a', 'b']);
  for await (const [key, visit] of byPage.entries('backward')) console.log(key, visit.at);
  for await (const key of byPage.keys()) console.log(key);
  await lastPages.push(message.payload.page);
  const first: string | null = await lastPages.at(0);
  for await (const page of lastPages) console.log(page);
  try {
    await count.commit();
  } catch (e) {
    if (isStateError(e) && e instanceof TransientStateError) console.log(e.isPermanent, many, first);
  }
}

void client;
void onMessage;
