"""Faults behind a running app: a damaged checkpoint, a download cut halfway, a broken detector, a GPU
out of memory. Each gets its own sentence, leaves no broken model in the cache, and once the cause is gone
the next request succeeds.

Each test evicts the model it needs first, so it loads (or fails to load) during the test whatever ran
before it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from app_server import PHOTOS, environment, running_app, tiny_detector
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from huggingface_hub.utils import httpx as hub_httpx  # the HTTP library huggingface_hub raises from

from sapiens2.models import hub, weights

PHOTO = handle_file(str(PHOTOS[1]))
OUT_OF_MEMORY = "The GPU ran out of memory. Choose a smaller model size or a smaller photo"


@pytest.fixture(scope="module")
def checkpoints(small_mirror, tmp_path_factory) -> Path:
    """A copy of the small checkpoints that these tests damage and repair."""
    root = tmp_path_factory.mktemp("checkpoints")
    shutil.copytree(small_mirror, root, dirs_exist_ok=True)
    return root


@pytest.fixture(scope="module")
def detector(tmp_path_factory) -> Path:
    return Path(tiny_detector(tmp_path_factory.mktemp("detector")))


@pytest.fixture(scope="module")
def server(checkpoints, detector, tmp_path_factory):
    with running_app(checkpoints, str(detector), tmp_path_factory.mktemp("scratch")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def refusal(client, api_name: str, **options) -> str:
    with pytest.raises(AppError) as caught:
        client.predict(PHOTO, api_name=api_name, **options)
    message = str(caught.value)
    assert "Traceback" not in message
    return message


def answered(client, api_name: str, **options) -> list:
    outputs = client.predict(PHOTO, api_name=api_name, **options)
    assert Path(outputs[0]).is_file()
    return outputs


def test_a_truncated_checkpoint_is_named_never_cached_and_loads_once_repaired(server, client, checkpoints):
    repo = "facebook/sapiens2-seg-0.4b"
    server.runtime.cache.evict(repo)
    weights = checkpoints / repo / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    try:
        message = refusal(client, "/segment")
        assert repo not in server.runtime.cache
        assert refusal(client, "/segment") == message, "a second try reads the file again"
    finally:
        weights.write_bytes(good)
    # The web never sees the server's folders; the operator's sentence, with the path, is in the log.
    assert message.startswith(f"The model {repo} could not be loaded: its files on this server are damaged.")
    assert str(checkpoints) not in message and "SAPIENS2_CHECKPOINT_DIR" not in message
    loads = server.runtime.cache.stats.loads
    answered(client, "/segment")
    assert repo in server.runtime.cache and server.runtime.cache.stats.loads == loads + 1


class HalfwayDownload:
    """Stands in for huggingface_hub's hf_hub_download, because the Hub cannot be reached from the test
    machine: this is a simulation. While `cut` is set, the weights stop halfway, leaving a partial
    `.incomplete` file as huggingface_hub does and raising the error it raises when the server keeps
    closing the connection mid-body; otherwise every file is delivered whole from `source`."""

    def __init__(self, source: Path):
        self.source = source
        self.cut = True
        self.calls: list[str] = []

    def __call__(self, repo_id: str, filename: str, *, cache_dir: str | None, **options) -> str:
        self.calls.append(filename)
        data = (self.source / repo_id / filename).read_bytes()
        target = Path(cache_dir) / repo_id / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(filename + ".incomplete")
        if self.cut and filename == hub.WEIGHTS_NAME:
            partial.write_bytes(data[: len(data) // 2])
            raise hub_httpx.RemoteProtocolError("peer closed connection without sending the whole body")
        target.write_bytes(data)
        partial.unlink(missing_ok=True)
        return str(target)


def test_a_download_cut_halfway_says_so_is_never_cached_and_the_next_request_downloads_it(
    server, client, small_mirror, tmp_path, monkeypatch
):
    repo = "facebook/sapiens2-pretrain-0.1b"
    server.runtime.cache.evict(repo)
    download = HalfwayDownload(small_mirror)
    monkeypatch.setattr(hub, "hf_hub_download", download)
    hub_cache = tmp_path / "hub"
    with environment(SAPIENS2_CHECKPOINT_DIR=str(tmp_path / "nothing"), HF_HUB_CACHE=str(hub_cache)):
        message = refusal(client, "/features")
        # The photo is resized first (config and preprocessor config), then the model's weights are fetched.
        assert download.calls[:2] == [hub.CONFIG_NAME, hub.PROCESSOR_CONFIG_NAME]
        assert download.calls[-1] == hub.WEIGHTS_NAME and download.calls.count(hub.WEIGHTS_NAME) == 1
        assert repo not in server.runtime.cache
        assert (hub_cache / repo / "model.safetensors.incomplete").is_file()
        assert message == f"The model {repo} could not be downloaded just now. Please try again in a moment."

        download.cut = False
        answered(client, "/features")
    assert repo in server.runtime.cache
    names = {path.name for path in (hub_cache / repo).iterdir()}
    assert {"config.json", "model.safetensors"} <= names and not any(".incomplete" in n for n in names)


def test_a_corrupt_detector_file_is_named_and_used_once_replaced(server, client, detector):
    server.runtime.cache.evict("facebook/sapiens2-pose-0.4b")
    good = detector.read_bytes()
    for damaged in (good[: len(good) // 3], b"not a checkpoint at all" * 100):
        detector.write_bytes(damaged)
        try:
            message = refusal(client, "/pose")
        finally:
            detector.write_bytes(good)
        assert message.startswith("The person detector could not be loaded on the server.")
        assert str(detector) not in message and "SAPIENS2_DETECTOR" not in message
    outputs = answered(client, "/pose")
    assert "No person detected." in outputs[2]  # after its two pictures; random weights find nobody


def test_out_of_memory_in_a_forward_gets_its_sentence_and_the_next_request_runs(server, client, monkeypatch):
    # A real GPU out-of-memory cannot happen on this CPU-only machine: the error is raised in its place.
    forward = server.runtime.forward
    raised = []

    def out_of_memory_once(*args, **kwargs):
        if not raised:
            raised.append(True)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(*args, **kwargs)

    monkeypatch.setattr(server.runtime, "forward", out_of_memory_once)
    message = refusal(client, "/features")
    assert message.startswith(OUT_OF_MEMORY) and "try again" in message
    assert raised
    answered(client, "/features")


def test_out_of_memory_while_loading_leaves_nothing_cached_and_the_next_request_loads(
    server, client, monkeypatch
):
    # As above, the error is raised where a real GPU would raise it: while weights are copied to the device.
    repo = "facebook/sapiens2-pointmap-0.4b"
    server.runtime.cache.evict(repo)

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB")

    with monkeypatch.context() as patch:
        patch.setattr(weights, "_materialize", out_of_memory)
        assert refusal(client, "/depth", remove_background=False).startswith(OUT_OF_MEMORY)
    assert repo not in server.runtime.cache
    answered(client, "/depth", remove_background=False)
    assert repo in server.runtime.cache
