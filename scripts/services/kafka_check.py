#!/usr/bin/env python3
"""Readiness probe for a Kafka broker, standard library only.

Sends a real Metadata request (API key 3, version 1, no topics) over a raw TCP
socket and checks that the response lists the expected broker id (and, with
--brokers N, at least N brokers: a cluster whose members all registered).

Usage: kafka_check.py [--host 127.0.0.1] [--port 9094] [--broker-id 1] [--brokers N] [--timeout 5] [-v]
Exit status: 0 when the broker answers and lists the broker id (and N brokers), 1 otherwise.
"""
import argparse
import socket
import struct
import sys

METADATA = 3


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
            raise ValueError("truncated Metadata response")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self):
        length = self.take(">h")
        if length < 0:
            return None
        if self.pos + length > len(self.data):
            raise ValueError("truncated string in Metadata response")
        value = self.data[self.pos:self.pos + length].decode("utf-8", "replace")
        self.pos += length
        return value


def metadata(host, port, timeout):
    client_id = b"prosody-services-check"
    correlation_id = 0x5052
    # Request header v1: api_key, api_version, correlation_id, client_id.
    header = struct.pack(">hhih", METADATA, 1, correlation_id, len(client_id)) + client_id
    # Metadata v1 body: topics array; an empty array asks for no topic.
    body = struct.pack(">i", 0)
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
    brokers = []
    for _ in range(r.take(">i")):
        node_id = r.take(">i")
        bhost = r.string()
        bport = r.take(">i")
        r.string()  # rack
        brokers.append((node_id, bhost, bport))
    controller_id = r.take(">i")
    return brokers, controller_id


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9094)
    p.add_argument("--broker-id", type=int, default=1)
    p.add_argument("--brokers", type=int, default=1)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
