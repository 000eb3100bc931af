"""Shared test setup: no network, and a session-wide directory of tiny checkpoints laid out like the Hub."""

import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")
# The default precision depends on the CPU (bf16 where it is native): tests run in fp32 on every machine,
# and the tests of that rule clear this variable.
os.environ.setdefault("SAPIENS2_DTYPE", "fp32")
# A test that turns HF_HUB_OFFLINE off stands in for the Hub itself; should anything still ask the Hub, it
# asks a closed port of this machine (refused at once), never the network.
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
# Gradio's file cache of this run alone: another run on the same machine (or a test that ages the cache)
# must never delete files this run is serving.
_GRADIO_CACHE = None if "GRADIO_TEMP_DIR" in os.environ else tempfile.mkdtemp(prefix="sapiens2-tests-gradio-")
if _GRADIO_CACHE:
    os.environ["GRADIO_TEMP_DIR"] = _GRADIO_CACHE

import pytest  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    if _GRADIO_CACHE:
        shutil.rmtree(_GRADIO_CACHE, ignore_errors=True)


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


@pytest.fixture(scope="session")
def few_persons_yolo(tmp_path_factory) -> str:
    """A yolo11n .pt that finds a few large persons (2 to 4) in any photo (see write_few_persons_yolo)."""
    from tiny_models import write_few_persons_yolo

    return write_few_persons_yolo(tmp_path_factory.mktemp("yolo") / "few_persons_yolo.pt")


@pytest.fixture(scope="session")
def small_mirror(tiny_mirror, tmp_path_factory):
    """Like `tiny_mirror` for each task's default checkpoints, with a preprocessor_config.json that runs
    them at 256x192 instead of 1024x768 (and a pointmap checkpoint built for that size)."""
    import json
    import shutil

    from tiny_models import repo_task_size, write_tiny_checkpoint

    from sapiens2.models.kinds import get_kind
    from sapiens2.tasks.registry import TASKS
    from sapiens2.vision.processing import ProcessorSettings

    root = tmp_path_factory.mktemp("small_hub")
    repo_ids = {repo_id for task in TASKS.values() for repo_id in task.repo_ids_needed(None)}
    for repo_id in sorted(repo_ids):
        kind, size = repo_task_size(repo_id)
        if kind == "pointmap":
            write_tiny_checkpoint(root / repo_id, kind, size=size, image_size=(256, 192))
        else:
            shutil.copytree(tiny_mirror / repo_id, root / repo_id)
            config_path = root / repo_id / "config.json"
            config = json.loads(config_path.read_text())
            config_path.write_text(json.dumps({**config, "image_size": [256, 192]}))
        padded = ProcessorSettings.for_kind(get_kind(kind)).do_pad
        settings = {"size": {"height": 256, "width": 192}, "do_pad": padded}
        (root / repo_id / "preprocessor_config.json").write_text(json.dumps(settings))
    return root


@pytest.fixture(scope="module")
def server(tiny_mirror, tmp_path_factory):
    """The real app on a free local port with the tiny checkpoints and a tiny detector, one per module."""
    from app_server import running_app, tiny_detector

    detector = tiny_detector(tmp_path_factory.mktemp("detector"))
    with running_app(tiny_mirror, detector, tmp_path_factory.mktemp("scratch")) as running:
        yield running
