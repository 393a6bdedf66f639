#!/usr/bin/env python3
"""Readiness probe for a Kafka broker, standard library only.

Sends a real Metadata request (API key 3, version 1, no topics) over a raw TCP
socket and checks that the response lists the expected broker id (and, with
--brokers N, at least N brokers: a cluster whose members all registered).
With --consumer-groups it also joins and leaves a KIP-848 consumer group
(ConsumerGroupHeartbeat, API key 68, version 0; group prosody-services-check,
subscribed to no topic) and requires the join to succeed: the broker runs
consumer groups (group.protocol=consumer). A broker that lists the API but has
the protocol off (group.coordinator.rebalance.protocols without `consumer`)
answers UNSUPPORTED_VERSION; the API's presence alone proves nothing.

The port defaults to that of the first address in PROSODY_TEST_BOOTSTRAP
(host:port[,...]) when it is set, else 9094.

Usage: kafka_check.py [--host 127.0.0.1] [--port 9094] [--broker-id 1] [--brokers N]
                      [--consumer-groups] [--timeout 5] [-v]
Exit status: 0 when the broker answers and lists the broker id (and N brokers,
and a consumer group join), 1 otherwise.
"""
import argparse
import os
import socket
import struct
import sys
import time

METADATA = 3
FIND_COORDINATOR = 10
CONSUMER_GROUP_HEARTBEAT = 68
CHECK_GROUP = b"prosody-services-check"
# Errors while the group coordinator is being loaded (the consumer offsets
# topic is created on the first FindCoordinator): retried.
COORDINATOR_LOADING = {14: "COORDINATOR_LOAD_IN_PROGRESS", 15: "COORDINATOR_NOT_AVAILABLE",
                       16: "NOT_COORDINATOR"}
UNSUPPORTED_VERSION = 35


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf.extend(chunk)
    return bytes(buf)


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError("truncated response")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self):
        length = self.take(">h")
        if length < 0:
            return None
        if self.pos + length > len(self.data):
            raise ValueError("truncated string in response")
        value = self.data[self.pos:self.pos + length].decode("utf-8", "replace")
        self.pos += length
        return value

    def uvarint(self):
        shift = value = 0
        while True:
            b = self.take(">B")
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ValueError("varint too long in response")

    def compact_string(self):
        length = self.uvarint() - 1
        if length < 0:
            return None
        if self.pos + length > len(self.data):
            raise ValueError("truncated string in response")
        value = self.data[self.pos:self.pos + length].decode("utf-8", "replace")
        self.pos += length
        return value


def compact_string(b):
    """A compact (flexible-version) string: unsigned varint length + 1, bytes;
    None is the null string. Our strings are under 127 bytes: one varint byte."""
    if b is None:
        return b"\x00"
    assert len(b) < 127
    return bytes([len(b) + 1]) + b


def call(host, port, timeout, api_key, api_version, body, flexible=False):
    """Sends one request and returns a Reader over the response body, past
    the response header. Header v1 (v2, and response header v1, when
    flexible)."""
    client_id = b"prosody-services-check"
    correlation_id = 0x5052
    # Request header v1: api_key, api_version, correlation_id, client_id;
    # v2 adds an empty tagged-field section.
    header = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id
    if flexible:
        header += b"\x00"
    request = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", recv_exact(sock, 4))
        if size <= 0 or size > 64 * 1024 * 1024:
            raise ValueError("implausible response size %d" % size)
        r = Reader(recv_exact(sock, size))
    if r.take(">i") != correlation_id:
        raise ValueError("correlation id mismatch")
    if flexible:
        for _ in range(r.uvarint()):  # response header tagged fields
            r.uvarint()
            r.pos += r.uvarint()
    return r


def heartbeat(host, port, timeout, member_id, member_epoch):
    """ConsumerGroupHeartbeat v0 for CHECK_GROUP; returns (error_code,
    error_message, member_id). Epoch 0 joins (subscribed to no topic, the
    broker names the member), -1 leaves."""
    joining = member_epoch == 0
    body = (compact_string(CHECK_GROUP)
            + compact_string(member_id)
            + struct.pack(">i", member_epoch)
            + compact_string(None)  # instance id
            + compact_string(None)  # rack id
            + struct.pack(">i", 5000 if joining else -1)  # rebalance timeout
            + (b"\x01" if joining else b"\x00")  # subscribed topics: [] or null
            + compact_string(None)  # server assignor
            + (b"\x01" if joining else b"\x00")  # owned partitions: [] or null
            + b"\x00")  # tagged fields
    r = call(host, port, timeout, CONSUMER_GROUP_HEARTBEAT, 0, body, flexible=True)
    r.take(">i")  # throttle time
    error = r.take(">h")
    message = r.compact_string()
    member = r.compact_string()
    return error, message, member


def consumer_groups(host, port, timeout, verbose):
    """Joins and leaves a KIP-848 consumer group; True when the join works.
    Asks for the group's coordinator first (which creates the consumer
    offsets topic) and retries while the coordinator loads."""
    # FindCoordinator v0: key (string); its answer is not needed here.
    call(host, port, timeout, FIND_COORDINATOR, 0,
         struct.pack(">h", len(CHECK_GROUP)) + CHECK_GROUP)
    deadline = time.monotonic() + max(timeout, 30.0)
    while True:
        error, message, member = heartbeat(host, port, timeout, b"", 0)
        if error not in COORDINATOR_LOADING or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if error == 0:
        heartbeat(host, port, timeout, member.encode(), -1)
        if verbose:
            print("kafka_check: KIP-848 consumer groups work (joined and left %s)"
                  % CHECK_GROUP.decode())
        return True
    if verbose:
        why = ("the consumer group protocol is off (group.coordinator.rebalance.protocols)"
               if error == UNSUPPORTED_VERSION else COORDINATOR_LOADING.get(error, "error"))
        print("kafka_check: ConsumerGroupHeartbeat: error %d, %s%s"
              % (error, why, ": " + message if message else ""), file=sys.stderr)
    return False


def metadata(host, port, timeout):
    # Metadata v1 body: topics array; an empty array asks for no topic.
    r = call(host, port, timeout, METADATA, 1, struct.pack(">i", 0))
    brokers = []
    for _ in range(r.take(">i")):
        node_id = r.take(">i")
        bhost = r.string()
        bport = r.take(">i")
        r.string()  # rack
        brokers.append((node_id, bhost, bport))
    controller_id = r.take(">i")
    return brokers, controller_id


def default_port():
    """The port of PROSODY_TEST_BOOTSTRAP's first address, else 9094."""
    first = os.environ.get("PROSODY_TEST_BOOTSTRAP", "").split(",")[0].strip()
    _, sep, port = first.rpartition(":")
    return int(port) if sep and port.isdigit() else 9094


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=default_port())
    p.add_argument("--broker-id", type=int, default=1)
    p.add_argument("--brokers", type=int, default=1)
    p.add_argument("--consumer-groups", action="store_true")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args()
    try:
        brokers, controller_id = metadata(a.host, a.port, a.timeout)
    except (OSError, ValueError) as e:
        if a.verbose:
            print("kafka_check: %s:%d: %s" % (a.host, a.port, e), file=sys.stderr)
        return 1
    if a.verbose:
        listed = ", ".join("%d@%s:%d" % b for b in brokers) or "none"
        print("kafka_check: brokers [%s], controller %d" % (listed, controller_id))
    if not any(b[0] == a.broker_id for b in brokers):
        if a.verbose:
            print("kafka_check: broker %d not listed" % a.broker_id, file=sys.stderr)
        return 1
    if len(brokers) < a.brokers:
        if a.verbose:
            print("kafka_check: %d of %d brokers listed" % (len(brokers), a.brokers), file=sys.stderr)
        return 1
    if a.consumer_groups:
        try:
            if not consumer_groups(a.host, a.port, a.timeout, a.verbose):
                return 1
        except (OSError, ValueError) as e:
            if a.verbose:
                print("kafka_check: %s:%d: consumer groups: %s" % (a.host, a.port, e), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
