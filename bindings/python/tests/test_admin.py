"""AdminClient: create and delete topics."""

import datetime

import pytest

from conftest import REAL, admin_options, base_options, unique
from prosody import AdminClient, EventHandler, ProsodyClient, ProsodyError


async def test_create_use_and_delete(recorder):
    admin = AdminClient(**admin_options())
    name = unique("py-admin")
    await admin.create_topic(name, partition_count=3, replication_factor=1,
                             cleanup_policy="delete", retention=datetime.timedelta(days=7))

    class H(EventHandler):
        async def on_message(self, context, message):
            await recorder.add(message.partition)

    c = ProsodyClient(**base_options(), group_id=unique("g"), subscribed_topics=name,
                      source_system="admin-test")
    await c.subscribe(H())
    for i in range(30):
        await c.send(name, f"k{i}", {"i": i})
    await recorder.wait_count(30)
    assert await c.assigned_partition_count() == 3
    assert set(recorder.events) <= {0, 1, 2}
    await c.unsubscribe()
    del c
    with pytest.raises(ProsodyError, match=name):
        await admin.create_topic(name, partition_count=3)
    await admin.delete_topic(name)


async def test_errors_name_the_topic():
    admin = AdminClient(**admin_options())
    missing = unique("py-missing")
    with pytest.raises(ProsodyError, match=missing) as info:
        await admin.delete_topic(missing)
    assert info.value.code == "PROSODY_ERR_UNKNOWN_TOPIC"
    with pytest.raises(ValueError, match="cleanup_policy"):
        await admin.create_topic(unique("t"), cleanup_policy="shred")
    with pytest.raises(ValueError, match="partition_count"):
        await admin.create_topic(unique("t"), partition_count=0)
    with pytest.raises(TypeError, match="retention"):
        await admin.create_topic(unique("t"), retention="7d")
    with pytest.raises(ValueError):
        await admin.create_topic("bad topic name!")


async def test_retention_as_float_seconds():
    admin = AdminClient(**admin_options())
    name = unique("py-ret")
    await admin.create_topic(name, partition_count=1, retention=3600.0)
    await admin.delete_topic(name)
