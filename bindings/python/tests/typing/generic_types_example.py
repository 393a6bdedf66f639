"""Payload and result types as the original's current API types them;
`mypy --strict` must pass. Every `type: ignore[code]` below marks a mistake
the stubs must catch: `--strict` reports an ignore that is not needed, so
this file fails if a signature becomes too loose."""

from typing import List, Optional, TypedDict

from typing_extensions import assert_type

from prosody import Context, EventHandler, ExciseMessage, Message, ProsodyClient, Timer, state
from prosody.message import JSONValue


class Order(TypedDict):
    sku: str
    qty: int


class Ack(TypedDict):
    ok: bool


ORDERS: state.MessageDequeDefinition[Order] = state.message_deque("orders", capacity=5)
COUNTS: state.MapDefinition[int] = state.map("counts")


class Untyped(EventHandler):
    """A bare handler sees JSON payloads."""

    async def on_message(self, context: Context, message: Message) -> None:
        assert_type(message, Message[JSONValue])


class Orders(EventHandler[Order, Ack]):
    async def on_message(self, context: Context, message: Message[Order]) -> Ack:
        qty: int = message.payload["qty"]
        kept = context.state(ORDERS)
        await kept.append(message)
        last = await kept.peek()
        assert_type(last, Optional[Message[Order]])
        skus: List[str] = [m.payload["sku"] async for m in kept]
        await kept.append(message.payload)  # type: ignore[arg-type]
        await context.state(COUNTS).set("n", "many")  # type: ignore[arg-type]
        print(qty, skus)
        return {"ok": True}

    async def on_excise(self, context: Context, message: ExciseMessage) -> Ack:
        return {"ok": False}

    async def on_timer(self, context: Context, timer: Timer) -> None:
        pass


async def main() -> None:
    client = await ProsodyClient.create(mock=True, group_id="g", subscribed_topics="t",
                                        state_collections=[ORDERS, COUNTS],
                                        state_recovery_delay="30s")
    await client.subscribe(Orders())
    await client.subscribe(Untyped())
    await client.send("t", "k", {"sku": "a", "qty": 1})
    await client.send("t", "k", object())  # type: ignore[arg-type]
    await ProsodyClient.create(no_such_option=1)  # type: ignore[call-arg]
    ProsodyClient(group_id=3)  # type: ignore[arg-type]
