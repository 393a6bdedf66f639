"""GET /metrics on the probe server, parsed by prometheus_client's text
parser: the families exist with their types, the counters match what the
handler saw (handled, failed and retried, duplicates skipped), the
histograms are consistent, and each assigned partition has its committed
offset and lag."""

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from conftest import unique
from prosody import EventHandler, TransientError


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families, name, suffix="", **labels):
    fam = families[name]
    for s in fam.samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {name}{suffix} {labels} in {fam.samples}")


class Handler(EventHandler):
    def __init__(self, recorder):
        self.recorder = recorder
        self.failed = set()

    async def on_message(self, context, message):
        n = message.payload["n"]
        if n % 10 == 0 and n not in self.failed:  # fails once, then succeeds
            self.failed.add(n)
            raise TransientError(f"first try of {n}")
        await self.recorder.add(n)


async def test_metrics_scraped_and_parsed(clients, topic, recorder):
    group = unique("g")
    c = clients(group_id=group, subscribed_topics=topic, probe_port=0, retry_base=0.01,
                max_retry_delay=0.05)
    await c.subscribe(Handler(recorder))
    port = c.probe_port
    assert isinstance(port, int) and port > 0
    for n in range(1, 51):  # 50 keys: every partition gets some
        await c.send(topic, f"k{n}", {"n": n, "id": f"e{n}"})
    await c.send(topic, "k1", {"n": 999, "id": "e1"})  # a duplicate of n=1 on k1
    await recorder.wait_count(50)

    # Counters move on the engine thread; the gauges are a snapshot taken
    # every poll_interval, and a lag uses the high watermark of the last
    # fetch: wait until the snapshot has every record committed.
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        fams = scrape(port)
        done = value(fams, "prosody_records_skipped", "_total", reason="duplicate") == 1
        committed = fams["prosody_partition_committed_offset"].samples
        lag = [s for s in fams["prosody_partition_lag"].samples]
        # (a deferred message is committed before its retry runs, and the
        # in-flight gauge's snapshot may predate the last retry: a handler
        # call is counted when the engine sees it end, after the handler
        # recorded its message, so wait for that count too)
        ended = value(fams, "prosody_handler_calls", "_total", kind="message", result="success")
        if (done and len(committed) == 4 and sum(s.value for s in committed) == 51
                and len(lag) == 4 and all(s.value == 0 for s in lag)
                and ended >= 50 and value(fams, "prosody_handlers_in_flight") == 0):
            break
        assert asyncio.get_running_loop().time() < deadline, fams
        await asyncio.sleep(0.1)

    types = {name: f.type for name, f in fams.items()}
    for name in ("prosody_records_consumed", "prosody_records_skipped",
                 "prosody_handler_calls", "prosody_retries", "prosody_deferred", "prosody_rejected",
                 "prosody_dead_lettered", "prosody_timers_scheduled", "prosody_timers_fired"):
        assert types[name] == "counter", name
    for name in ("prosody_handler_duration_seconds", "prosody_scheduler_wait_seconds"):
        assert types[name] == "histogram", name
    for name in ("prosody_partitions_assigned", "prosody_handlers_in_flight",
                 "prosody_timers_pending", "prosody_partition_committed_offset",
                 "prosody_partition_lag"):
        assert types[name] == "gauge", name

    assert value(fams, "prosody_records_consumed", "_total") == 51
    calls = lambda r: value(fams, "prosody_handler_calls", "_total", kind="message", result=r)
    assert calls("success") == 50
    assert calls("transient") == 5  # n = 10, 20, 30, 40, 50 failed once
    assert calls("permanent") == 0
    # each failure is retried in place, or deferred (when the failure rate
    # allows: the first one may come before any success)
    assert (value(fams, "prosody_retries", "_total")
            + value(fams, "prosody_deferred", "_total")) == 5
    assert value(fams, "prosody_partitions_assigned") == 4
    assert value(fams, "prosody_handlers_in_flight") == 0

    # Histograms: cumulative buckets, +Inf equals the count.
    h = fams["prosody_handler_duration_seconds"]
    buckets = [s for s in h.samples if s.name.endswith("_bucket")]
    assert [s.labels["le"] for s in buckets][-1] == "+Inf"
    counts = [s.value for s in buckets]
    assert counts == sorted(counts)
    assert counts[-1] == value(fams, "prosody_handler_duration_seconds", "_count") == 55
    assert value(fams, "prosody_handler_duration_seconds", "_sum") > 0
    assert value(fams, "prosody_scheduler_wait_seconds", "_count") >= 55

    # Per partition: committed offset (next to commit; they add up to the
    # 51 records once done, as waited for above) and lag 0.
    assert sorted(int(s.labels["partition"]) for s in committed) == [0, 1, 2, 3]
    assert all(s.labels["topic"] == topic for s in committed)
    assert sorted(int(s.labels["partition"]) for s in lag) == [0, 1, 2, 3]
