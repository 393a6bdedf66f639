#!/usr/bin/env python3
"""Python package benchmarks: the same script runs under our package
(bindings/python) and under the original Rust-based `prosody-events` from
PyPI, each in its own virtualenv (bench/python/run.sh sets both up).

It is written against the API of /work/shared/spec/python-api.md (the
README of prosody-events 0.3.0): `ProsodyClient(**config)`,
`client.subscribe(handler)`, `await client.send(...)`,
`await client.unsubscribe()`, `AdminClient(...).create_topic(...)`. Newer
releases of the original (0.5, 0.6) changed that API: the client is built
with `await ProsodyClient.create(**config)`, `subscribe` is a coroutine and
handlers must also define `on_excise`. `new_client` and `maybe_await` below
are the only concessions to them, so the latest release runs unchanged too.

  bench_python.py consume --label L [--records N] [--max-seconds S]
                          [--max-concurrency C --max-uncommitted U] [--state]
  bench_python.py send    --label L [--tasks T] [--count N] [--seconds S]

consume: a fresh 4-partition topic (AdminClient), filled with N keyed JSON
records (keys key-0000..key-0999, ~110-byte JSON objects with a unique `id`)
by build-release/bench/bench_fill, then a client with a fresh group id
subscribes with an async no-op `on_message` that counts. Throughput is
measured from the first record handled to the N-th, or, if the package has
not handled N records --max-seconds after the first, over that window
(`window=` says which). CPU time is the whole process's (every thread:
the package's native threads as well as the event loop), over the same
window, per record handled.

--state: the handler also adds one to a keyed-state value per record
(`await ctx.state(count).get()` then `.set(...)`: keyed state of
prosody-events >= 0.4, `state_collections=[value("count")]`), stored in
Cassandra with each record's success; the setting is then "state".

send: a fresh 4-partition topic, then T asyncio tasks each awaiting
`client.send(topic, key, payload)` in a loop (same keys and payloads as
consume) until N sends completed or S seconds passed, whichever first.

Output: one line each, in bench/run.sh's format:
  bench python-consume-<setting>-<label> VALUE records/s cpu_us=X ...
  bench python-send-<label> VALUE sends/s cpu_us=X ...
Progress and the package's own logging go to stderr.
"""
import argparse
import ast
import asyncio
import inspect
import os
import subprocess
import sys
import time
import uuid

from prosody import AdminClient, EventHandler, ProsodyClient

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def package_version():
    try:
        from importlib.metadata import version
        return version("prosody-events")
    except Exception:  # noqa: BLE001 - only a label
        return "unknown"


async def maybe_await(x):
    if inspect.isawaitable(x):
        return await x
    return x


async def new_client(**config):
    """The spec's `ProsodyClient(**config)`; prosody-events >= 0.5 raises
    TypeError there and wants `await ProsodyClient.create(**config)`."""
    create = getattr(ProsodyClient, "create", None)
    if create is not None:
        return await create(**config)
    return ProsodyClient(**config)


async def close_client(client, subscribed):
    if subscribed:
        await maybe_await(client.unsubscribe())
    # prosody-events >= 0.5 only: stops the client's background services.
    shutdown = getattr(client, "shutdown", None)
    if shutdown is not None:
        try:
            await maybe_await(shutdown())
        except Exception as e:  # noqa: BLE001
            print(f"shutdown: {e}", file=sys.stderr)


def common_config(args):
    """Options both packages get: no probe server, no telemetry emitter
    (the original's default is on; ours ignores the option), and the
    Cassandra node the original needs outside mock mode."""
    config = {"bootstrap_servers": args.bootstrap, "probe_port": None,
              "telemetry_enabled": False}
    if args.cassandra:
        config["cassandra_nodes"] = args.cassandra
        if args.cassandra_keyspace:
            config["cassandra_keyspace"] = args.cassandra_keyspace
    for o in args.option:  # diagnostics only; make bench passes none
        name, _, value = o.partition("=")
        try:
            config[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            config[name] = value
    return config


def key_of(i):
    return "key-%04d" % ((i * 7919) % 1000)


async def fresh_topic(args, kind):
    topic = "bench-py-%s-%s-%s" % (kind, args.label, uuid.uuid4().hex[:8])
    admin = AdminClient(bootstrap_servers=args.bootstrap)
    await admin.create_topic(topic, partition_count=4, replication_factor=1)
    return admin, topic


async def delete_topic(admin, topic):
    try:
        await admin.delete_topic(topic)
    except Exception as e:  # noqa: BLE001 - cleanup only
        print(f"delete_topic {topic}: {e}", file=sys.stderr)


class Counter(EventHandler):
    """The no-op handler: counts, and notes the wall and CPU time of the
    first and the n-th record. Handlers are coroutines on the event loop
    thread in both packages, so the plain counter needs no lock."""

    def __init__(self, n, state=None):
        self.n = n
        self.state = state  # a value definition, or None
        self.count = 0
        self.first = self.last = None
        self.cpu_first = self.cpu_last = None
        self.done = asyncio.Event()

    async def on_message(self, context, message):
        if self.state is not None:
            st = context.state(self.state)
            await st.set((await st.get() or 0) + 1)
        self.count += 1
        if self.count == 1:
            self.first = time.perf_counter()
            self.cpu_first = time.process_time()
        elif self.count == self.n:
            self.last = time.perf_counter()
            self.cpu_last = time.process_time()
            self.done.set()

    async def on_timer(self, context, timer):
        pass

    # Required by prosody-events >= 0.5 (abstract there); unused here.
    async def on_excise(self, context, message):
        pass


async def consume(args):
    admin, topic = await fresh_topic(args, "consume")
    try:
        await consume_topic(args, topic)
    finally:
        await delete_topic(admin, topic)


async def consume_topic(args, topic):
    setting = ("state" if args.state else
               "default" if args.max_concurrency is None else "wide")
    t = time.perf_counter()
    subprocess.run([args.filler, args.bootstrap, topic, str(args.records)],
                   check=True)
    print(f"consume[{args.label}]: {topic} filled with {args.records} records "
          f"in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    config = common_config(args)
    config.update(group_id="bench-py-" + uuid.uuid4().hex[:12],
                  subscribed_topics=topic)
    if args.max_concurrency is not None:
        config["max_concurrency"] = args.max_concurrency
    if args.max_uncommitted is not None:
        config["max_uncommitted"] = args.max_uncommitted
    state = None
    if args.state:
        from prosody import value  # keyed state: prosody-events >= 0.4
        state = value("count")
        config["state_collections"] = [state]
    client = await new_client(**config)
    handler = Counter(args.records, state)
    subscribed = False
    try:
        subscribed_at = time.perf_counter()
        await maybe_await(client.subscribe(handler))
        subscribed = True
        while handler.first is None:
            if time.perf_counter() - subscribed_at > args.first_timeout:
                raise SystemExit(f"consume[{args.label}]: no record within "
                                 f"{args.first_timeout:.0f} s of subscribing")
            await asyncio.sleep(0.01)
        join_s = handler.first - subscribed_at
        deadline = handler.first + args.max_seconds
        try:
            await asyncio.wait_for(handler.done.wait(),
                                   max(0.0, deadline - time.perf_counter()))
            n, wall = handler.n, handler.last - handler.first
            cpu = handler.cpu_last - handler.cpu_first
            window = "complete"
        except asyncio.TimeoutError:
            cpu_now, now, n = time.process_time(), time.perf_counter(), handler.count
            wall, cpu = now - handler.first, cpu_now - handler.cpu_first
            window = "%.0fs" % args.max_seconds
    finally:
        t = time.perf_counter()
        await close_client(client, subscribed)
        print(f"consume[{args.label}]: closed in "
              f"{time.perf_counter() - t:.1f} s", file=sys.stderr)
    rate = n / wall
    print(f"consume[{args.label}] {setting}: {n} records in {wall:.2f} s "
          f"= {rate:.0f} records/s, {cpu:.2f} s CPU, first record "
          f"{join_s:.1f} s after subscribe", file=sys.stderr)
    options = ("" if setting == "default" else
               " keyed_state=value-counter" if setting == "state" else
               f" max_concurrency={args.max_concurrency} "
               f"max_uncommitted={args.max_uncommitted}")
    print(f"bench python-consume-{setting}-{args.label} {rate:.0f} records/s "
          f"cpu_us={cpu / max(n, 1) * 1e6:.1f} records={n} window={window}"
          f"{options} version={package_version()}", flush=True)


async def send(args):
    admin, topic = await fresh_topic(args, "send")
    try:
        await send_topic(args, topic)
    finally:
        await delete_topic(admin, topic)


async def send_topic(args, topic):
    config = common_config(args)
    config["source_system"] = "bench-py-send"
    client = await new_client(**config)
    claimed = done = 0
    stop_at = None

    async def worker():
        nonlocal claimed, done
        while claimed < args.count and time.perf_counter() < stop_at:
            i = claimed
            claimed += 1
            key = key_of(i)
            await client.send(topic, key, {
                "id": "%s-%010d" % (topic, i), "type": "order.created",
                "amount": (i * 31) % 1000 + (i % 100) / 100, "customer": key})
            done += 1

    try:
        # One acknowledged send first: connections and the producer id are
        # set up outside the measurement.
        await client.send(topic, "key-warmup", {"id": "warmup", "type": "order.created"})
        cpu0, t0 = time.process_time(), time.perf_counter()
        stop_at = t0 + args.seconds
        await asyncio.gather(*(worker() for _ in range(args.tasks)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await close_client(client, False)
    rate = done / wall
    print(f"send[{args.label}]: {done} sends in {wall:.2f} s = {rate:.0f}/s, "
          f"{cpu:.2f} s CPU", file=sys.stderr)
    print(f"bench python-send-{args.label} {rate:.0f} sends/s "
          f"cpu_us={cpu / max(done, 1) * 1e6:.1f} sends={done} tasks={args.tasks} "
          f"version={package_version()}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("consume", "send"):
        s = sub.add_parser(name)
        s.add_argument("--label", required=True,
                       help="result name suffix, e.g. ours or original")
        s.add_argument("--bootstrap", default="127.0.0.1:9094")
        s.add_argument("--cassandra", default="127.0.0.1:9042",
                       help="cassandra_nodes ('' for none)")
        s.add_argument("--cassandra-keyspace", default=None)
        s.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                       help="one more client option (a Python literal, else "
                            "a string), for diagnostics; repeatable")
    c = sub.choices["consume"]
    c.add_argument("--records", type=int, default=200000)
    c.add_argument("--max-seconds", type=float, default=30.0,
                   help="measure over this window after the first record "
                        "if the N-th has not been handled by then")
    c.add_argument("--first-timeout", type=float, default=120.0)
    c.add_argument("--max-concurrency", type=int, default=None)
    c.add_argument("--max-uncommitted", type=int, default=None)
    c.add_argument("--state", action="store_true",
                   help="a keyed-state counter per key in the handler")
    c.add_argument("--filler", default=os.path.join(
        ROOT, os.environ.get("BENCH_BUILD", "build-release"), "bench", "bench_fill"))
    s = sub.choices["send"]
    s.add_argument("--tasks", type=int, default=100)
    s.add_argument("--count", type=int, default=100000)
    s.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args()
    if (args.cmd == "consume" and
            (args.max_concurrency is None) != (args.max_uncommitted is None)):
        p.error("--max-concurrency and --max-uncommitted go together")
    asyncio.run(consume(args) if args.cmd == "consume" else send(args))


if __name__ == "__main__":
    main()
