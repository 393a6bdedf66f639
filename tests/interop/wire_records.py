#!/usr/bin/env python3
"""Interop: the records each implementation writes besides the application's
own (the telemetry topic's events, the failure topic's records and headers,
the source-system and trace headers), compared field by field on a real
Kafka.

Run by scripts/interop-tests.sh with the ORIGINAL's venv, which also holds
confluent-kafka (pinned there) to write records with headers and read every
header back. Each side runs tests/interop/wire_probe.py in its own process
(--original-python, --ours-python) on topics of its own, fed the same four
records: "ok" with a traceparent and a tracestate, "trans" with a
traceparent and a baggage, "bad" and "tfail" with no trace context. The
test waits until each side's topics hold what the scenario writes (19
telemetry events, 2 dead letters, 1 sent record; bounded by
PROSODY_INTEROP_WAIT seconds, default 120), stops the probe, reads the
topics to their end, and compares them record by record:

  telemetry  the same events (key, type, how many); each event's field
             names in the same order and each field's JSON type; the enum
             values (type, timerType, demandType, errorCategory), offsets,
             partitions, keys, hostname, topic and source (modulo the run's
             names) equal; eventTime to the millisecond and scheduledTime to
             the second in RFC 3339 UTC; traceParent a W3C traceparent in the
             record's trace where the record had one, traceState equal
  failure    the same keys; values the same JSON document; header names in
             the same order; source-kind, -partition, -offset, -error,
             baggage, tracestate equal; source-topic, -group-id, -system
             equal modulo the run's names; source-timestamp RFC 3339 with ms
  sent       the same headers, in order, with the same trace

The differences docs/MIGRATION.md ("Records on the wire") lists are
allowed and nothing else: `exception` text; the failure topic's value bytes
(the same JSON document); where the original started a trace itself (a
record without one, a timer's handler) ours carries none, or the
scheduling context; ours passes a context's span id on where the original
makes a span of its own (same trace id); a fired timer's events have
traceState "" in ours. Kafka: PROSODY_TEST_BOOTSTRAP (127.0.0.1:9094); Cassandra:
PROSODY_TEST_CASSANDRA_NODES (127.0.0.1:9042), keyspace prosody_pytest for
both (as tests/interop/shared_group.py). Exit status 0 when it passed.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = os.environ.get("PROSODY_TEST_BOOTSTRAP", "127.0.0.1:9094")
CASSANDRA = os.environ.get("PROSODY_TEST_CASSANDRA_NODES", "127.0.0.1:9042")
WAIT = float(os.environ.get("PROSODY_INTEROP_WAIT", "120"))
# One keyspace for both, as tests/interop/shared_group.py (the Python suite's).
KEYSPACES = {"original": "prosody_pytest", "ours": "prosody_pytest"}

TP_OK = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TP_TRANS = "00-0af7651916cd43dd8448eb211c80319d-b7ad6b7169203332-01"
INPUT = [  # key, value, headers
    ("ok", {"n": 1}, [("traceparent", TP_OK), ("tracestate", "vendor=x")]),
    ("bad", {"n": 2, "b": [1, 2]}, []),
    ("trans", {"n": 3}, [("traceparent", TP_TRANS), ("baggage", "user=alice")]),
    ("tfail", {"n": 4}, []),
]
TRACE_OF = {"ok": TP_OK.split("-")[1], "sent-ok": TP_OK.split("-")[1],
            "trans": TP_TRANS.split("-")[1]}
WANT_TELEMETRY, WANT_FAILED, WANT_SENT = 19, 2, 1

MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
EQUAL = ("type", "timerType", "demandType", "errorCategory", "offset", "partition", "key",
         "hostname")
NAMED = ("topic", "source")  # equal once the run's suffix is taken out

Record = Dict[str, Any]


class Failure(Exception):
    pass


def names(suffix: str) -> Dict[str, str]:
    return {"topic": f"wire-in-{suffix}", "out": f"wire-out-{suffix}",
            "failure": f"wire-failed-{suffix}", "telemetry": f"wire-telemetry-{suffix}",
            "group": f"wire-group-{suffix}", "source": f"wire-source-{suffix}"}


def high_watermarks(consumer: Consumer, topic: str) -> int:
    """The end offset of the topic's partition; 0 while a topic just made
    has no leader yet."""
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    except KafkaException as e:
        if e.args[0].code() in (KafkaError.NOT_LEADER_FOR_PARTITION,
                                KafkaError.LEADER_NOT_AVAILABLE,
                                KafkaError.UNKNOWN_TOPIC_OR_PART):
            return 0
        raise


def read_all(topic: str) -> List[Record]:
    """Every record of the topic's one partition, up to its end now."""
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"wire-reader-{uuid.uuid4().hex}",
                  "enable.auto.commit": False})
    try:
        end = high_watermarks(c, topic)
        c.assign([TopicPartition(topic, 0, 0)])
        out: List[Record] = []
        deadline = time.monotonic() + WAIT
        while len(out) < end:
            if time.monotonic() > deadline:
                raise Failure(f"read {len(out)} of {end} records of {topic}")
            m = c.poll(1.0)
            if m is None or m.error():
                continue
            out.append({"key": m.key().decode() if m.key() is not None else None,
                        "value": m.value().decode() if m.value() is not None else None,
                        "headers": [(k, v.decode() if v is not None else None)
                                    for k, v in (m.headers() or [])]})
        return out
    finally:
        c.close()


def run_side(side: str, python: str, log_dir: Path) -> Tuple[Dict[str, str], Dict[str, List[Record]]]:
    """Runs one side's probe on topics of its own; returns its names and
    what its topics hold once it has written everything."""
    suffix = f"{side}-{uuid.uuid4().hex[:10]}"
    n = names(suffix)
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    for f in admin.create_topics([NewTopic(n[t], 1, 1) for t in
                                  ("topic", "out", "failure", "telemetry")]).values():
        f.result(timeout=30)
    p = Producer({"bootstrap.servers": BOOTSTRAP})
    for key, value, headers in INPUT:
        p.produce(n["topic"], key=key, value=json.dumps(value), headers=headers)
    if p.flush(30):
        raise Failure(f"{side}: the input records were not written")
    log = open(log_dir / f"wire-{side}.log", "w")
    probe = subprocess.Popen(
        [python, str(Path(__file__).with_name("wire_probe.py")), "--bootstrap", BOOTSTRAP,
         "--cassandra", CASSANDRA, "--keyspace", KEYSPACES[side], "--group", n["group"],
         "--topic", n["topic"], "--out-topic", n["out"], "--failure-topic", n["failure"],
         "--telemetry-topic", n["telemetry"], "--source-system", n["source"]],
        stdout=subprocess.PIPE, stderr=log, text=True)
    lines: List[str] = []
    reader = threading.Thread(target=lambda: lines.extend(probe.stdout), daemon=True)
    reader.start()
    try:
        c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"wire-w-{uuid.uuid4().hex}"})
        want = {"telemetry": WANT_TELEMETRY, "failure": WANT_FAILED, "out": WANT_SENT}
        deadline = time.monotonic() + WAIT
        while True:
            have = {t: high_watermarks(c, n[t]) for t in want}
            if all(have[t] >= want[t] for t in want):
                break
            if probe.poll() is not None:
                raise Failure(f"{side}: its probe exited ({probe.returncode}) with {have}, "
                              f"want {want}; see {log.name}")
            if time.monotonic() > deadline:
                raise Failure(f"{side}: after {WAIT:.0f} s its topics hold {have}, want {want}; "
                              f"see {log.name}")
            time.sleep(0.2)  # polling the broker's watermarks: there is no event to await
        c.close()
        probe.terminate()
        try:
            probe.wait(WAIT)
        except subprocess.TimeoutExpired:
            probe.kill()
            raise Failure(f"{side}: its probe did not stop within {WAIT:.0f} s of SIGTERM")
    finally:
        if probe.poll() is None:
            probe.kill()
        reader.join(5)
        log.close()
    got = {t: read_all(n[t]) for t in ("telemetry", "failure", "out")}
    return n, got


def neutral(value: str, n: Dict[str, str]) -> str:
    """A value with the run's own names replaced by their role."""
    for role, name in n.items():
        value = value.replace(name, f"<{role}>")
    return value


def jtype(v: Any) -> str:
    return {str: "string", int: "integer", bool: "boolean", float: "number",
            type(None): "null", dict: "object", list: "array"}[type(v)]


def trace_id(tp: Optional[str]) -> Optional[str]:
    return tp.split("-")[1] if tp else None


def compare_event(o: Record, u: Record, no: Dict[str, str], nu: Dict[str, str],
                  problems: List[str]) -> None:
    what = f'{o["key"]} {o["type"]}'
    timer = o["type"].startswith("prosody.timer.")
    # Where the original started a trace of its own, ours may have none.
    own_trace = trace_id(o.get("traceParent")) != TRACE_OF.get(o["key"])
    fields_o = [k for k in o if not (own_trace and k in ("traceParent", "traceState")
                                     and k not in u)]
    if list(u) != fields_o:
        problems.append(f"{what}: fields {list(u)}, the original's {list(o)}")
    for k in set(o) & set(u):
        if jtype(o[k]) != jtype(u[k]):
            problems.append(f"{what}: {k} is a {jtype(u[k])}, the original's a {jtype(o[k])}")
    for k in EQUAL:
        if k in o and o.get(k) != u.get(k):
            problems.append(f"{what}: {k} {u.get(k)!r}, the original's {o[k]!r}")
    for k in NAMED:
        if neutral(str(o[k]), no) != neutral(str(u.get(k)), nu):
            problems.append(f"{what}: {k} {u.get(k)!r}, the original's {o[k]!r}")
    for v, fmt, name in ((u.get("eventTime"), MS, "eventTime"),
                         (o.get("eventTime"), MS, "the original's eventTime")):
        if not isinstance(v, str) or not fmt.match(v):
            problems.append(f"{what}: {name} {v!r} is not RFC 3339 UTC with milliseconds")
    if timer:
        for v in (u.get("scheduledTime"), o.get("scheduledTime")):
            if not isinstance(v, str) or not SECONDS.match(v):
                problems.append(f"{what}: scheduledTime {v!r} is not RFC 3339 UTC to the second")
    if "traceParent" in u:
        if not TRACEPARENT.match(u["traceParent"]):
            problems.append(f"{what}: traceParent {u['traceParent']!r} is not W3C")
        if not own_trace and trace_id(u["traceParent"]) != trace_id(o["traceParent"]):
            problems.append(f"{what}: traceParent {u['traceParent']} not in the record's trace "
                            f"{trace_id(o['traceParent'])}")
        fired = o["type"] in ("prosody.timer.dispatched", "prosody.timer.succeeded",
                              "prosody.timer.failed")
        if not fired and not own_trace and u.get("traceState") != o.get("traceState"):
            problems.append(f"{what}: traceState {u.get('traceState')!r}, "
                            f"the original's {o.get('traceState')!r}")
        if fired and u.get("traceState") != "":
            problems.append(f"{what}: traceState {u.get('traceState')!r}, want \"\"")


def compare_telemetry(orig: List[Record], ours: List[Record], no: Dict[str, str],
                      nu: Dict[str, str], problems: List[str]) -> int:
    def events(records: List[Record], side: str) -> Dict[Tuple[str, str], List[Record]]:
        by: Dict[Tuple[str, str], List[Record]] = defaultdict(list)
        for r in records:
            e = json.loads(r["value"])
            if r["key"] != e.get("key") or r["headers"]:
                problems.append(f"{side}: telemetry record key {r['key']!r} / headers "
                                f"{r['headers']} for event {r['value']}")
            by[(e["key"], e["type"])].append(e)
        for evs in by.values():  # a retry's events after the first attempt's
            evs.sort(key=lambda e: (e.get("demandType") == "failure", e["eventTime"]))
        return by
    eo, eu = events(orig, "original"), events(ours, "ours")
    count_o = Counter({k: len(v) for k, v in eo.items()})
    count_u = Counter({k: len(v) for k, v in eu.items()})
    if count_o != count_u:
        problems.append(f"telemetry events differ: ours {sorted(count_u.items())}, "
                        f"the original's {sorted(count_o.items())}")
    compared = 0
    for k in eo.keys() & eu.keys():
        for o, u in zip(eo[k], eu[k]):
            compare_event(o, u, no, nu, problems)
            compared += 1
    return compared


def compare_headers(what: str, o: Record, u: Record, no: Dict[str, str], nu: Dict[str, str],
                    problems: List[str]) -> None:
    ho, hu = dict(o["headers"]), dict(u["headers"])
    own_trace = trace_id(ho.get("traceparent")) != TRACE_OF.get(o["key"])
    names_o = [k for k, _ in o["headers"]
               if not (own_trace and k in ("traceparent", "tracestate") and k not in hu)]
    names_u = [k for k, _ in u["headers"]]
    if names_u != names_o:
        problems.append(f"{what}: headers {names_u}, the original's {[k for k, _ in o['headers']]}")
    for k in ("source-kind", "source-partition", "source-offset", "source-error", "baggage"):
        if k in ho and ho[k] != hu.get(k):
            problems.append(f"{what}: {k} {hu.get(k)!r}, the original's {ho[k]!r}")
    for k in ("source-topic", "source-group-id", "source-system"):
        if k in ho and neutral(ho[k], no) != neutral(str(hu.get(k)), nu):
            problems.append(f"{what}: {k} {hu.get(k)!r}, the original's {ho[k]!r}")
    if "source-timestamp" in ho and not MS.match(hu.get("source-timestamp", "")):
        problems.append(f"{what}: source-timestamp {hu.get('source-timestamp')!r}")
    if "traceparent" in hu:
        if not TRACEPARENT.match(hu["traceparent"]) or \
                (not own_trace and trace_id(hu["traceparent"]) != trace_id(ho["traceparent"])):
            problems.append(f"{what}: traceparent {hu['traceparent']!r}, the original's "
                            f"{ho.get('traceparent')!r}")
        if hu.get("tracestate") != ho.get("tracestate"):
            problems.append(f"{what}: tracestate {hu.get('tracestate')!r}, the original's "
                            f"{ho.get('tracestate')!r}")


def compare_records(what: str, orig: List[Record], ours: List[Record], no: Dict[str, str],
                    nu: Dict[str, str], problems: List[str]) -> int:
    bo, bu = {r["key"]: r for r in orig}, {r["key"]: r for r in ours}
    if sorted(bo) != sorted(bu) or len(bo) != len(orig) or len(bu) != len(ours):
        problems.append(f"{what}: keys {sorted(r['key'] for r in ours)}, the original's "
                        f"{sorted(r['key'] for r in orig)}")
    for key in bo.keys() & bu.keys():
        if json.loads(bo[key]["value"]) != json.loads(bu[key]["value"]):
            problems.append(f"{what} {key}: value {bu[key]['value']}, the original's "
                            f"{bo[key]['value']}")
        compare_headers(f"{what} {key}", bo[key], bu[key], no, nu, problems)
    return len(bo.keys() & bu.keys())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--original-python", required=True)
    ap.add_argument("--ours-python", required=True)
    ap.add_argument("--log-dir", required=True)
    args = ap.parse_args()
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        no, orig = run_side("original", args.original_python, log_dir)
        nu, ours = run_side("ours", args.ours_python, log_dir)
        problems: List[str] = []
        events = compare_telemetry(orig["telemetry"], ours["telemetry"], no, nu, problems)
        failed = compare_records("failure record", orig["failure"], ours["failure"], no, nu,
                                 problems)
        sent = compare_records("sent record", orig["out"], ours["out"], no, nu, problems)
        if problems:
            raise Failure("\n  ".join(["records differ:"] + problems))
    except Failure as e:
        print(f"interop wire_records: FAILED: {e}", file=sys.stderr)
        return 1
    print(f"interop wire_records: {events} telemetry events, {failed} failure records and "
          f"{sent} sent record compared field by field, as the original's "
          f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
