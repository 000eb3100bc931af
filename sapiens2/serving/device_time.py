"""How long one request, and one client, may hold the device.

The device slot times every hold of the device and charges it to the request's `DeviceAccount` (its
job's budget), which charges its client in the `DeviceLedger` too. A request may hold the device for
`SAPIENS2_MAX_DEVICE_SECONDS` in all (a video holds it batch by batch: the sum of its batches), and a
client for `SAPIENS2_DEVICE_SECONDS_PER_CLIENT` over the last `WINDOW` seconds. The work checks its
account between batches, frames and tasks (through its `Job`), and stops there with a sentence saying
which limit it reached and how to get under it; a client over its share is refused before it waits.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sapiens2.errors import DeviceTimeError
from sapiens2.settings import current

CLIENT_SECONDS_ENV = "SAPIENS2_DEVICE_SECONDS_PER_CLIENT"
WINDOW = 600  # seconds over which a client's device time is counted
FEWER = "send a shorter clip or a smaller photo, or choose a smaller model size"


class DeviceLedger:
    """Seconds each client held the device over the last `window` seconds: one entry per hold, in the
    order they ended, forgotten once older than the window (whoever the client), with a running total
    per client."""

    def __init__(self, window: float = WINDOW, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self.clock = clock
        self._lock = threading.Lock()
        self._holds: deque[tuple[float, str, float]] = deque()
        self._totals: dict[str, float] = {}

    @property
    def clients(self) -> int:
        """Clients with device time in the window: what the ledger keeps besides its entries."""
        with self._lock:
            self._forget_old()
            return len(self._totals)

    def _forget_old(self) -> None:
        oldest = self.clock() - self.window
        while self._holds and self._holds[0][0] < oldest:
            _, client, seconds = self._holds.popleft()
            left = self._totals.pop(client, 0.0) - seconds
            if left > 1e-9:
                self._totals[client] = left

    def charge(self, client: str, seconds: float) -> None:
        with self._lock:
            self._forget_old()
            self._holds.append((self.clock(), client, seconds))
            self._totals[client] = self._totals.get(client, 0.0) + seconds

    def used(self, client: str) -> float:
        """Seconds `client` held the device within the window."""
        with self._lock:
            self._forget_old()
            return self._totals.get(client, 0.0)

    def wait_minutes(self, client: str, seconds_over: float) -> int:
        """Whole minutes until `seconds_over` of `client`'s device time have left the window."""
        with self._lock:
            self._forget_old()
            holds = [(ended, seconds) for ended, who, seconds in self._holds if who == client]
        freed, now = 0.0, self.clock()
        for ended, seconds in holds:
            freed += seconds
            if freed >= seconds_over:
                return max(1, int((ended + self.window - now) // 60) + 1)
        return max(1, int(self.window // 60))


class DeviceAccount:
    """One request's device time: what it held so far, charged to its client as each hold ends."""

    def __init__(self, ledger: DeviceLedger, client: str, request_seconds: int, client_seconds: int):
        self.ledger, self.client = ledger, client
        self.request_seconds, self.client_seconds = request_seconds, client_seconds
        self.spent = 0.0
        self._since: float | None = None

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Count the block as time on the device."""
        self._since = time.monotonic()
        try:
            yield
        finally:
            held, self._since = time.monotonic() - self._since, None
            self.spent += held
            self.ledger.charge(self.client, held)

    def _holding_now(self) -> float:
        since = self._since
        return 0.0 if since is None else time.monotonic() - since

    def check(self) -> None:
        """Raise DeviceTimeError once this request, or its client, went over its device time."""
        now = self._holding_now()
        if self.spent + now > self.request_seconds:
            raise DeviceTimeError(
                f"This request was stopped after {self.request_seconds} s on the model, this server's "
                f"limit per request. To get under it, {FEWER}."
            )
        if self.ledger.used(self.client) + now > self.client_seconds:
            raise DeviceTimeError(f"This request was stopped: {self._over_share()}")

    def check_client(self) -> None:
        """Raise DeviceTimeError when the client has no device time left (before its request waits)."""
        if self.ledger.used(self.client) >= self.client_seconds:
            raise DeviceTimeError(f"Request refused: {self._over_share()}")

    def _over_share(self) -> str:
        minutes = self.ledger.wait_minutes(self.client, self.ledger.used(self.client) - self.client_seconds)
        return (
            f"you have used the model for {self.client_seconds} s in the last {self.ledger.window / 60:g} "
            f"minutes, this server's limit per person. Please try again in {minutes} "
            f"minute{'s' if minutes != 1 else ''}, or {FEWER}."
        )


def request_seconds() -> int:
    """The device seconds one request may hold (`SAPIENS2_MAX_DEVICE_SECONDS`)."""
    return current().max_device_seconds


class DeviceBudget:
    """The app's device time: every client's ledger, and the limits (read for each request); a client is
    its address, as the upload quota counts it (`SAPIENS2_TRUSTED_PROXIES`)."""

    def __init__(self, ledger: DeviceLedger | None = None):
        self.ledger = ledger or DeviceLedger()
        self.trusted_proxies = current().trusted_proxies

    def account(self, client: str) -> DeviceAccount:
        """A new request's account; DeviceTimeError when its client has no device time left."""
        account = DeviceAccount(
            self.ledger,
            client,
            request_seconds(),
            current().device_seconds_per_client,
        )
        account.check_client()
        return account
