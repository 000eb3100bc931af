"""The upload ledger's bookkeeping: what it stores per chunk, and who a client is behind a proxy."""

from __future__ import annotations

from sapiens2.serving.uploads import BUCKETS_PER_WINDOW, UploadLedger, client_address


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_chunk_adds_to_a_running_count_instead_of_a_history():
    clock = Clock()
    ledger = UploadLedger(10**9, 10**12, window=2400, clock=clock)
    for chunk in range(20_000):  # 1 KB chunks from 100 clients, as a slow upload sends them
        assert ledger.take(f"10.0.0.{chunk % 100}", 1000) is None
    assert ledger.stored_entries == 100  # one count per client per bucket, not one per chunk
    assert ledger.used("10.0.0.7") == (200 * 1000, 20_000 * 1000)
    clock.now = 2400 + 2 * 2400 / BUCKETS_PER_WINDOW
    assert ledger.take("10.0.0.1", 5) is None
    assert ledger.stored_entries == 1 and ledger.used("10.0.0.1") == (5, 5)


def test_a_refusal_counts_nothing():
    ledger = UploadLedger(1000, 10**6, window=2400, clock=Clock())
    assert ledger.refusal("a", 5000) is not None and ledger.used("a") == (0, 0)
    assert ledger.take("a", 5000) is not None and ledger.used("a") == (0, 0)


def test_only_the_entries_the_proxies_appended_name_the_client():
    def scope(forwarded: str) -> dict:
        return {"client": ("10.1.1.1", 1), "headers": [(b"x-forwarded-for", forwarded.encode())]}

    spoofed = {client_address(scope(f"198.51.100.{n}, 203.0.113.5"), 1) for n in range(50)}
    assert spoofed == {"203.0.113.5"}
    assert client_address(scope("1.2.3.4, 203.0.113.5, 10.0.0.2"), 2) == "203.0.113.5"
    assert client_address(scope(""), 1) == "10.1.1.1"


def test_an_ipv6_client_is_its_64_block_whatever_the_spelling():
    def scope(peer: str, forwarded: str = "") -> dict:
        return {"client": (peer, 1), "headers": [(b"x-forwarded-for", forwarded.encode())]}

    # One subscriber's /64 holds 2**64 addresses: each one a client of its own would have its own shares.
    block = [
        "2001:db8:1:2::a",
        "[2001:db8:1:2::b]:443",
        "2001:0DB8:0001:0002:ffff:0000:0000:000c",
        "2001:db8:1:2:abcd:ef01:2345:6789",
    ]
    assert {client_address(scope("10.1.1.1", f"{address}, 10.0.0.2"), 2) for address in block} == {
        "2001:db8:1:2::/64"
    }
    peers = [address for address in block if not address.startswith("[")]  # a peer's address has no port
    assert {client_address(scope(address), 0) for address in peers} == {"2001:db8:1:2::/64"}
    assert client_address(scope("10.1.1.1", "2001:db8:1:3::a, 10.0.0.2"), 2) == "2001:db8:1:3::/64"
    assert client_address(scope("::ffff:192.0.2.5"), 0) == "192.0.2.5"
    assert client_address(scope("10.1.1.1", "192.0.2.5:8080"), 1) == "192.0.2.5"
    assert client_address(scope("10.1.1.1", "not an address"), 1) == "not an address"
