// What the compiler checks for users of the typed API (payload types, JSON-only sends, definitions
// only from the constructors, literal error categories): `tsc --noEmit` must pass, and each
// `@ts-expect-error` must still find its error.
import { AdminClient, Configuration, Context, EventHandler, ExciseMessage, JsonValue, Message, PermanentError,
         PermanentStateError, ProsodyClient, TransientError, TransientStateError, ValueState, map,
         messageDeque, value } from '@prosody-events/prosody';

// Compiles only when A and B are the same type (not merely assignable either way).
type Same<A, B> = (<X>() => X extends A ? 0 : 1) extends (<X>() => X extends B ? 0 : 1) ? true : false;
function same<A, B>(proof: Same<A, B>): void { void proof; }

interface Shipment { id: string; weightKg: number; labels?: string[] }

declare const client: ProsodyClient;

// A Message without a payload type carries a JsonValue: a field is not readable before narrowing.
declare const plain: Message;
same<typeof plain.payload, JsonValue>(true);
// @ts-expect-error: a JsonValue has no known fields
void plain.payload.id;

// The handler's payload type flows from EventHandler<P> (or subscribe<P>) into onMessage.
const shipments = {
  async onMessage(_context, message, _signal) {
    same<typeof message, Message<Shipment>>(true);
    const kg: number = message.payload.weightKg;
    // @ts-expect-error: Shipment has no field `owner`
    void message.payload.owner;
    void kg;
  },
  async onExcise(_context, message) {
    same<typeof message, ExciseMessage>(true);
  },
  async onTimer() {},
} satisfies EventHandler<Shipment>;
void client.subscribe(shipments);
void client.subscribe<Shipment>({
  onMessage: (_context: Context, message) => {
    same<typeof message.payload, Shipment>(true);
  },
});

// send takes anything with a JSON form, interfaces included, and nothing else.
const parcel: Shipment = { id: 's-1', weightKg: 2 };
void client.send('shipments', 's-1', parcel);
void client.send('shipments', 's-2', ['a', 1, null, { deep: [true] }] as const);
// @ts-expect-error: a function has no JSON form
void client.send('shipments', 's-3', () => 1);
// @ts-expect-error: undefined is not a payload
void client.send('shipments', 's-4', undefined);
// @ts-expect-error: a Date is not sent as itself; send date.toISOString()
void client.send('shipments', 's-5', new Date());
// @ts-expect-error: nor is a field holding undefined
void client.send('shipments', 's-6', { when: undefined });
// @ts-expect-error: nor a bigint inside an array
void client.send('shipments', 's-7', [1n]);

// Definitions: stateCollections is an option of Configuration; context.state() takes only what
// the constructors made.
const totals = map<number>('totals', { keysetLimit: 64 });
const options: Configuration = { groupId: 'g', stateCollections: [totals, messageDeque<Shipment>('recent')] };
void new ProsodyClient(options);
// @ts-expect-error: an admin client has no collections
void new AdminClient({ mock: true, stateCollections: [totals] });
declare const context: Context;
const count: ValueState<number> = context.state(value<number>('count'));
void count;
// @ts-expect-error: a hand-written object is not a definition
context.state({ name: 'count', kind: 'value', payload: 'json' });
// @ts-expect-error: keysetLimit is a map's option
value('v', { keysetLimit: 1 });

// The error classes say their category in their type.
same<TransientError['isPermanent'], false>(true);
same<PermanentError['isPermanent'], true>(true);
same<TransientStateError['isPermanent'], false>(true);
same<PermanentStateError['isPermanent'], true>(true);
