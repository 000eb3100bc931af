"""Without the Hub, the page lists the model sizes that can run here and says what to fetch for the rest,
instead of promising downloads that cannot happen."""

from __future__ import annotations

import shutil

import pytest
from app_server import environment

import app
from sapiens2.models import hub_access
from sapiens2.runtime.runtime import Runtime
from sapiens2.tasks.registry import TASKS


@pytest.fixture
def pose_default_only(tiny_mirror, tmp_path):
    """A checkpoint folder holding Pose's default size only (and its body-part helper, if any)."""
    for repo_id in TASKS["pose"].repo_ids_needed(None):
        shutil.copytree(tiny_mirror / repo_id, tmp_path / repo_id)
    return tmp_path


def _dropdowns(demo) -> list[dict]:
    config = demo.get_config_file()
    return [c["props"] for c in config["components"] if c["type"] == "dropdown"]


def _markdowns(demo) -> str:
    config = demo.get_config_file()
    return "\n".join(str(c["props"].get("value")) for c in config["components"] if c["type"] == "markdown")


def test_offline_the_pose_tab_lists_only_the_sizes_on_this_server(pose_default_only, tmp_path):
    pose = TASKS["pose"]
    with environment(
        SAPIENS2_CHECKPOINT_DIR=str(pose_default_only),
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(tmp_path / "cache"),
    ):
        runtime = Runtime(device="cpu")
        assert hub_access.local_only()
        assert runtime.offered_sizes("pose") == [pose.default_size]
        demo = app.build_app(runtime)
        notes = _markdowns(demo)
    listed = [[value for _, value in props["choices"]] for props in _dropdowns(demo)]
    assert [pose.default_size] in listed
    missing = [size for size in pose.repos if size != pose.default_size]
    assert f"others ({', '.join(missing)})" in notes and pose.repo_id(missing[-1]) in notes
    assert "First use downloads" not in notes


def test_offline_a_size_that_is_not_here_says_what_to_fetch_not_what_it_would_download(
    pose_default_only, tmp_path
):
    with environment(
        SAPIENS2_CHECKPOINT_DIR=str(pose_default_only),
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(tmp_path / "cache"),
    ):
        note = Runtime(device="cpu").download_note("pose", "1b")
    assert note.startswith("facebook/sapiens2-pose-1b is not on this server and the Hub cannot be reached")
    assert "hf download facebook/sapiens2-pose-1b" in note and "GB" not in note


def test_with_every_checkpoint_here_every_size_is_listed(tiny_mirror, tmp_path):
    with environment(
        SAPIENS2_CHECKPOINT_DIR=str(tiny_mirror), HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "cache")
    ):
        runtime = Runtime(device="cpu")
        for name, task in TASKS.items():
            here = [size for size in task.repos if (tiny_mirror / task.repo_id(size)).is_dir()]
            assert runtime.offered_sizes(name) == here
        assert runtime.missing_sizes_note("pose") is None
