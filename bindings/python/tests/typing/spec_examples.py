"""The spec's examples, as a user writes them; `mypy --strict` must pass."""

import asyncio
import datetime
import signal
from typing import List

from prosody import (AdminClient, Context, EventHandler, Message, ProsodyClient, Timer,
                     permanent)


class MyHandler(EventHandler):
    async def on_message(self, context: Context, message: Message) -> None:
        print(f"Received message: {message}")
        payload = message.payload
        if isinstance(payload, dict) and payload.get("schedule_followup"):
            future_time = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=30)
            await context.schedule(future_time)
        scheduled_times: List[datetime.datetime] = await context.scheduled()
        print(f"Scheduled timers: {len(scheduled_times)}")
        if context.should_cancel():
            return

    async def on_timer(self, context: Context, timer: Timer) -> None:
        print(f"Timer fired for key: {timer.key} at {timer.time}")
        await context.clear_and_schedule(timer.time + datetime.timedelta(minutes=1))
        await context.unschedule(timer.time)
        await context.clear_scheduled()


class Classified(EventHandler):
    @permanent(TypeError, AttributeError)
    async def on_message(self, context: Context, message: Message) -> None:
        await context.on_cancel()


async def main() -> None:
    client = ProsodyClient(
        bootstrap_servers="localhost:9092",
        source_system="my-application-source",
        group_id="my-application",
        subscribed_topics="my-topic",
        defer_enabled=True,
        defer_base=1.0,
        defer_max_delay=86400.0,
        defer_failure_threshold=0.9,
        monopolization_window=300.0,
        timeout=30.0,
        stall_threshold=60.0,
        probe_port=8000,
        allowed_events=["user.", "account."],
        idempotence_ttl=datetime.timedelta(days=7),
        mode="low-latency",
        failure_topic="failed-messages",
    )
    client.subscribe(MyHandler())
    await client.send("my-topic", "message-key", {"content": "Hello, Kafka!"})
    state: str = await client.consumer_state()
    print(state, client.source_system)
    shutdown_event = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        asyncio.get_running_loop().add_signal_handler(sig, shutdown_event.set)
    await shutdown_event.wait()
    await client.unsubscribe()

    admin = AdminClient(bootstrap_servers="localhost:9092")
    await admin.create_topic("test-topic", partition_count=4, replication_factor=1,
                             cleanup_policy="delete", retention=datetime.timedelta(days=7))
    await admin.create_topic("other", retention=604800.0)
    await admin.delete_topic("test-topic")


if __name__ == "__main__":
    asyncio.run(main())
