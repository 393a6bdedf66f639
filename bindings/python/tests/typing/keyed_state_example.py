"""Keyed state as a user writes it; `mypy --strict` must pass."""

from datetime import timedelta
from typing import Dict, List, Optional, Tuple

from prosody import (Context, Direction, EventHandler, ExciseMessage, Message, NullValueError,
                     ProsodyClient, Timer, state)

CART = state.value("cart", ttl=timedelta(days=30))
TOTALS: state.MapDefinition[int] = state.map("totals", keyset_limit=256)
BACKLOG: state.DequeDefinition[Dict[str, str]] = state.deque("backlog", capacity=100)


class Counter(EventHandler):
    async def on_message(self, context: Context, message: Message) -> None:
        totals = context.state(TOTALS)
        n: Optional[int] = await totals.get(message.key)
        await totals.set(message.key, (n or 0) + 1)
        first: int = await totals.get("first", 0)
        present: bool = await totals.contains("x")
        many: List[Optional[int]] = await totals.get_many(["a", "b"])
        pairs: List[Tuple[str, int]] = [kv async for kv in totals.items(Direction.BACKWARD)]
        keys: List[str] = [k async for k in totals]
        backlog = context.state(BACKLOG)
        await backlog.append({"key": message.key})
        head: Optional[Dict[str, str]] = await backlog.popleft()
        size: int = await backlog.size()
        cart = context.state(CART)
        try:
            await cart.set(None)
        except NullValueError:
            await cart.clear()
        await cart.commit()
        print(first, present, many, pairs, keys, head, size)

    async def on_excise(self, context: Context, message: ExciseMessage) -> None:
        await context.state(CART).rollback()

    async def on_timer(self, context: Context, timer: Timer) -> None:
        pass


async def main() -> None:
    client = await ProsodyClient.create(mock=True, group_id="g", subscribed_topics="t",
                                        state_collections=[CART, TOTALS, BACKLOG])
    await client.subscribe(Counter())
    # Published state, read by key from any client.
    reader = await ProsodyClient.create(mock=True, source_system="reader",
                                        state_read_cache=False)
    totals = await reader.state("counting", TOTALS)
    n: Optional[int] = await totals.get("customer", "a")
    entries: List[Tuple[str, int]] = [kv async for kv in totals.items("customer")]
    backlog = await reader.state("counting", BACKLOG)
    last: Optional[Dict[str, str]] = await backlog.peek("customer")
    empty: bool = await backlog.is_empty("customer")
    cart = await reader.state("counting", state.value("cart", read_cache=timedelta(seconds=1)))
    doc = await cart.get("customer")
    print(n, entries, last, empty, doc)
    await client.shutdown()
