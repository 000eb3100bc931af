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


@pytest.fixture(scope="session")
def person_yolo(tmp_path_factory) -> str:
    """A real ultralytics yolo11n built from its yaml (no download), biased so that it finds persons.

    Random weights score every class alike; raising the person bias on the coarse levels and lowering
    every other class makes its real results persons. COCO names are kept so class 0 reads 'person'.
    """
    import torch
    from ultralytics import YOLO

    torch.manual_seed(0)
    model = YOLO("yolo11n.yaml")
    with torch.no_grad():
        for level, branch in enumerate(model.model.model[-1].cv3):
            branch[-1].bias.fill_(-9.0)
            branch[-1].bias[0] = 2.0 if level else -9.0
    model.model.names = {0: "person", **{i: f"class{i}" for i in range(1, 80)}}
    path = tmp_path_factory.mktemp("yolo") / "person_yolo.pt"
    model.save(str(path))
    return str(path)
