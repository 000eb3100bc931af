"""The device-time ledger's bookkeeping: what a client used over the window, and when it frees up."""

from __future__ import annotations

import pytest
from test_upload_ledger import Clock

from sapiens2.errors import DeviceTimeError
from sapiens2.serving.device_time import DeviceAccount, DeviceLedger


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(clock) -> DeviceLedger:
    return DeviceLedger(window=600, clock=clock)


def test_holds_are_forgotten_once_older_than_the_window(clock, ledger):
    ledger.charge("a", 100.0)
    clock.now = 300
    ledger.charge("a", 50.0)
    ledger.charge("b", 7.0)
    assert ledger.used("a") == 150.0 and ledger.used("b") == 7.0
    clock.now = 601
    assert ledger.used("a") == 50.0
    clock.now = 901
    assert ledger.used("a") == 0.0 and ledger.used("nobody") == 0.0
    assert ledger.clients == 0  # a client that never comes back is forgotten too


def test_many_clients_are_forgotten_without_coming_back(clock, ledger):
    for second in range(10_000):
        clock.now = float(second)
        ledger.charge(f"10.0.{second // 256}.{second % 256}", 0.5)
    assert ledger.clients == 601  # the last ten minutes' clients only


def test_the_wait_is_until_enough_of_the_clients_time_has_left_the_window(clock, ledger):
    ledger.charge("a", 200.0)
    clock.now = 240
    ledger.charge("a", 200.0)
    clock.now = 299
    assert ledger.wait_minutes("a", 100.0) == 6  # the first hold leaves at 600 s: 301 s from now
    assert ledger.wait_minutes("a", 300.0) == 10  # both must go: the second leaves at 840 s


def test_a_client_with_no_time_left_is_refused_before_it_starts(ledger):
    ledger.charge("a", 300.0)
    account = DeviceAccount(ledger, "a", request_seconds=120, client_seconds=300)
    with pytest.raises(DeviceTimeError, match="Request refused: you have used the model for 300 s"):
        account.check_client()
    DeviceAccount(ledger, "b", request_seconds=120, client_seconds=300).check_client()
