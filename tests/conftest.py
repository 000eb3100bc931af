"""Shared test setup: no network, and a session-wide directory of tiny checkpoints laid out like the Hub."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_mirror(tmp_path_factory):
    """`<root>/<repo id>/` holding a tiny random checkpoint for every official Sapiens2 repo id."""
    from tiny_models import write_tiny_mirror

    return write_tiny_mirror(tmp_path_factory.mktemp("hub"))
