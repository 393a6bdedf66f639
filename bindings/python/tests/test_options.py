"""Options: converted by the package, validated by libprosody's table."""

import datetime
import logging
import os

import pytest

import prosody
from prosody import AdminClient, ProsodyClient
from prosody import prosody as native


def test_every_option_of_the_table_accepts_none():
    names = native.options()
    assert "max_concurrency" in names and "cassandra_nodes" in names
    ProsodyClient(mock=True, group_id="g",
                  **{n: None for n in names if n not in ("mock", "group_id")})


def test_unknown_option_names_it():
    with pytest.raises(ValueError, match="max_concurency"):
        ProsodyClient(mock=True, max_concurency=4)


def test_positional_arguments_refused():
    with pytest.raises(TypeError, match="keyword"):
        ProsodyClient("localhost:9092")  # type: ignore[call-arg]


@pytest.mark.parametrize("name,value,accepted", [
    ("max_concurrency", 1.5, "integer"),
    ("max_concurrency", True, "integer"),
    ("mock", "yes please", None),
    ("retry_base", [1], "duration"),
    ("defer_enabled", 1, "true"),
    ("subscribed_topics", ["a", 3], "list"),
    ("group_id", 5, None),
])
def test_wrong_type_names_option(name, value, accepted):
    with pytest.raises((TypeError, ValueError)) as info:
        ProsodyClient(mock=True, **{name: value})
    assert name in str(info.value)
    if accepted:
        assert accepted in str(info.value)
    if not isinstance(value, str):
        assert info.type is TypeError


@pytest.mark.parametrize("name,value", [
    ("max_concurrency", 0),
    ("max_concurrency", 10**30),
    ("mode", "fastest"),
    ("retry_base", -1.0),
    ("retry_base", float("nan")),
    ("poll_interval", "soon"),
    ("bootstrap_servers", "no-port-here"),
    ("defer_failure_threshold", 1.5),
    ("probe_port", 70000),
])
def test_bad_value_raises_value_error_naming_option(name, value):
    with pytest.raises(ValueError, match=name):
        ProsodyClient(mock=True, **{name: value})


@pytest.mark.parametrize("name", ["message_spans", "timer_spans"])
def test_span_options_name_themselves(name):
    with pytest.raises(ValueError, match=name) as info:
        ProsodyClient(mock=True, **{name: "sideways"})
    assert "follows_from" in str(info.value)
    ProsodyClient(mock=True, source_system="t", **{name: "follows_from"})
    ProsodyClient(mock=True, source_system="t", **{name: "child"})


def test_rules_between_options_are_checked():
    with pytest.raises(ValueError, match="max_retry_delay"):
        ProsodyClient(mock=True, retry_base=10, max_retry_delay=1)
    with pytest.raises(ValueError, match="failure_topic"):
        ProsodyClient(mock=True, mode="low-latency", group_id="g", subscribed_topics="t")


def test_durations_accept_seconds_ints_timedeltas_and_text():
    ProsodyClient(mock=True, source_system="t", retry_base=2, max_retry_delay=datetime.timedelta(minutes=5),
                  timeout=0.25, stall_threshold="90s", send_timeout=datetime.timedelta(milliseconds=1500),
                  idempotence_ttl=datetime.timedelta(days=7), defer_failure_threshold=1)


def test_lists_accept_str_or_list():
    a = ProsodyClient(mock=True, group_id="g", subscribed_topics="a, b")
    b = ProsodyClient(mock=True, group_id="g", subscribed_topics=["a", "b"],
                      allowed_events=("user.", "account."))
    assert a.consumer_state() == "configured" and b.consumer_state() == "configured"


def test_environment_fallback(monkeypatch):
    monkeypatch.setenv("PROSODY_GROUP_ID", "from-env")
    monkeypatch.setenv("PROSODY_SUBSCRIBED_TOPICS", "t1")
    c = ProsodyClient(mock=True)
    assert c.consumer_state() == "configured"
    assert c.source_system == "from-env"
    # An explicit value wins over the environment; None leaves it unset.
    assert ProsodyClient(mock=True, group_id="explicit").source_system == "explicit"
    assert ProsodyClient(mock=True, group_id=None).source_system == "from-env"
    monkeypatch.setenv("PROSODY_MAX_CONCURRENCY", "zero")
    with pytest.raises(ValueError, match="PROSODY_MAX_CONCURRENCY"):
        ProsodyClient(mock=True)


@pytest.mark.parametrize("value,warned", [
    ("grpc", False), ("http/json", False), ("http/protobuf", False),
    ("bogus", True), ("grpc/2", True)])
def test_otel_protocol_variable_never_breaks_a_client(monkeypatch, caplog, value, warned):
    # Containers set OTEL_EXPORTER_OTLP_PROTOCOL for every process: a value
    # libprosody does not know is one warning, never a failed constructor.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", value)
    caplog.set_level(logging.WARNING, logger="prosody")
    ProsodyClient(mock=True, group_id="g", otel_exporter_otlp_endpoint="http://127.0.0.1:1")
    AdminClient(mock=True)
    said = [r for r in caplog.records if "OTEL_EXPORTER_OTLP_PROTOCOL" in r.getMessage()]
    assert len(said) == (1 if warned else 0)
    if warned:
        assert said[0].name == "prosody.config" and said[0].levelno == logging.WARNING
        assert "one of http/protobuf, http/json, grpc" in said[0].getMessage()


def test_needs_bootstrap_unless_mock(monkeypatch):
    monkeypatch.delenv("PROSODY_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("PROSODY_MOCK", raising=False)
    with pytest.raises(ValueError, match="bootstrap_servers"):
        ProsodyClient(group_id="g")


async def test_state_source_system_and_probe_port():
    c = ProsodyClient(mock=True, source_system="src")
    assert c.source_system == "src"
    assert c.consumer_state() == "unconfigured"
    assert await c.consumer_state() == "unconfigured"
    assert c.probe_port is None
    assert await c.assigned_partition_count() == 0
    assert await c.is_stalled() is False
    with pytest.raises(ValueError, match="group_id"):
        c.subscribe(object())  # type: ignore[arg-type]
    assert await c.unsubscribe() is None  # nothing to stop: no error


def test_subscribe_without_running_loop_is_a_clear_error():
    c = ProsodyClient(mock=True, group_id="g", subscribed_topics="t")

    class H(prosody.EventHandler):
        async def on_message(self, context, message):
            pass

    with pytest.raises(RuntimeError, match="running asyncio event loop"):
        c.subscribe(H())
    assert c.consumer_state() == "configured"


def test_admin_options_validated():
    with pytest.raises(ValueError, match="bootstrap_servers"):
        AdminClient(bootstrap_servers="::nonsense::")
    with pytest.raises(TypeError, match="keyword"):
        AdminClient("localhost:9092")  # type: ignore[call-arg]


def test_fork_guard():
    c = ProsodyClient(mock=True, group_id="g", subscribed_topics="t")
    a = AdminClient(mock=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every call refuses with a clear error
        import asyncio
        failures = []

        def check(fn):
            try:
                fn()
                failures.append("no error")
            except RuntimeError as e:
                if "after fork" not in str(e):
                    failures.append(str(e))

        check(lambda: c.consumer_state())
        check(lambda: c.source_system)

        async def in_loop():
            check(lambda: c.send("t", "k", {}))
            check(lambda: c.subscribe(object()))
            check(lambda: c.unsubscribe())
            check(lambda: a.create_topic("x"))

        asyncio.run(in_loop())
        os.write(w, ("ok" if not failures else ";".join(failures)).encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    assert out == "ok"
    assert c.consumer_state() == "configured"  # the parent's client still works
