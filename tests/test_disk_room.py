"""A full disk under Gradio's cache folder (where it keeps every upload and copies every answer's files)
gets the sentence the app's scratch folders give, not an HTTP 500 or a bare "Error", and leaves nothing
written in part. The disk is a real small tmpfs (mounting needs root: skipped without)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from app_server import PHOTOS, environment, running_app, small_disk, tiny_detector
from gradio_client import handle_file
from test_reliability_attacks import refused, still_serving

from sapiens2.serving import disk_room

MB = 1_000_000
DISK_FULL = "The server's disk is full, so the results could not be written. Please try again later."


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory) -> Iterator[Path]:
    """An 8 MB tmpfs: room for photos and a small answer, not for the depth task's files (a depth map, a
    point cloud, meshes and 16-bit maps take over 8 MB for the test photo)."""
    with small_disk(tmp_path_factory.mktemp("small_cache"), 8 * MB // 1024) as folder:
        yield folder


@pytest.fixture(scope="module")
def server(small_mirror, small_cache, tmp_path_factory):
    detector = tiny_detector(tmp_path_factory.mktemp("detector"))
    with environment(GRADIO_TEMP_DIR=str(small_cache)):
        with running_app(small_mirror, detector, tmp_path_factory.mktemp("scratch")) as running:
            yield running


def _files(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


def test_an_answer_too_large_for_the_cache_disk_gets_the_disk_full_sentence(server, small_cache):
    client = server.client()
    still_serving(client)  # a small answer fits
    before = _files(small_cache)
    assert refused(client, handle_file(str(PHOTOS[1])), "/depth") == DISK_FULL
    new = _files(small_cache) - before
    assert all(path.name == PHOTOS[1].name for path in new), new  # the upload only: no answer in part
    assert not [path for path in server.scratch.root.rglob("*") if path.is_file() and "depth" in path.name]
    still_serving(client)


def test_an_upload_larger_than_the_room_left_is_refused_before_a_byte_is_written(server, small_cache):
    before = _files(small_cache)
    body = os.urandom(8 * MB)  # more than the whole disk
    answer = requests.post(
        f"{server.url.rstrip('/')}/gradio_api/upload",
        files={"files": ("big.png", body, "image/png")},
        timeout=60,
    )
    assert answer.status_code == 507
    assert answer.json()["detail"] == disk_room.UPLOAD_REFUSED
    assert _files(small_cache) == before
    still_serving(server.client())
