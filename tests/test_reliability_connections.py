"""Slow and numerous connections through the running app: half-sent requests are answered 408 once their
headers are late, one address holds a bounded number of connections, and a crowd of half-sent requests
from many addresses (loopback addresses 127.0.0.x) never keeps a visitor from being answered."""

from __future__ import annotations

import logging
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest
from app_server import environment, running_app, tiny_detector
from peak_memory import PeakMemory, report

from sapiens2.serving.connections import ConnectionGuard, quiet_accept_errors

LIMITS = {
    "SAPIENS2_HEADER_SECONDS": "2",
    "SAPIENS2_CONNECTIONS_PER_CLIENT": "8",
    "SAPIENS2_MAX_CONNECTIONS": "48",
}


@pytest.fixture(scope="module")
def server(tiny_mirror, tmp_path_factory):
    detector = tiny_detector(tmp_path_factory.mktemp("detector"))
    with environment(**LIMITS):
        with running_app(tiny_mirror, detector, tmp_path_factory.mktemp("scratch")) as running:
            yield running


def half_sent(url: str, address: str) -> socket.socket:
    """A connection from `address` that sends the start of a request's headers and then nothing."""
    place = urlparse(url)
    connection = socket.create_connection(
        (place.hostname, place.port), timeout=30, source_address=(address, 0)
    )
    connection.sendall(b"GET /config HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    return connection


def answer_of(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (at most 30 s); b"reset" when it closed
    it at once, before reading the request (the system then resets it)."""
    chunks = []
    try:
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        return b"".join(chunks) or b"reset"
    finally:
        connection.close()
    return b"".join(chunks)


def visitor(url: str, address: str) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30) as client:
        return client.get(f"{url}config")


def guard_of(server) -> ConnectionGuard:
    return server.demo.server.config.http_protocol_class.guard


def test_half_sent_requests_are_answered_408_and_one_address_holds_at_most_its_share(server):
    # Before: 2000 half-sent requests were all held for good; a visitor's GET /config got no answer.
    with PeakMemory() as memory:
        held = [half_sent(server.url, "127.0.0.5") for _ in range(12)]
        answers = [answer_of(connection) for connection in held]
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 429") or a == b"reset"]
    late = [a for a in answers if a.startswith(b"HTTP/1.1 408")]
    assert len(refused) == 4 and len(late) == 8, answers
    assert all(b"this server holds at most 8 at a time per person" in a for a in refused if a != b"reset")
    assert b"did not arrive within 2 seconds" in late[0]
    assert visitor(server.url, "127.0.0.5").status_code == 200  # its places are free again
    report("12 half-sent requests from one address (each answered)", memory)


def test_a_crowd_of_half_sent_requests_from_many_addresses_never_keeps_a_visitor_out(server):
    guard = guard_of(server)
    crowd = []
    try:
        with PeakMemory() as memory:
            for index in range(120):  # 120 addresses, more than the 48 places
                crowd.append(half_sent(server.url, f"127.0.1.{index + 1}"))
            started = time.perf_counter()
            response = visitor(server.url, "127.0.0.9")
            waited = time.perf_counter() - started
        assert response.status_code == 200 and response.json()["components"]
        assert guard.held <= guard.total
    finally:
        for connection in crowd:
            connection.close()
    print(f"\n[figure] the visitor's GET /config during 120 half-sent requests: {waited:.2f} s")
    report("120 half-sent requests from 120 addresses and a visitor", memory)


def test_the_accept_error_is_logged_once_a_minute(caplog):
    quiet_accept_errors()
    logger = logging.getLogger("asyncio")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(1000):
            logger.error("socket.accept() out of system resource\nOSError: [Errno 24] Too many open files")
    assert len(caplog.records) <= 1
