"""Fine-tuned models in the app: a pose model with its own keypoints and a segmentation model with its own
classes, trained by `sapiens2 train`, are choices of their tasks' model lists and answer through the API."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from app_server import PHOTOS, running_app, tiny_detector
from gradio_client import handle_file
from PIL import Image
from test_training import options, trainable_checkpoint
from tiny_datasets import CLASS_NAMES, POSE_NAMES, write_pose, write_segmentation

from sapiens2.errors import ConfigError
from sapiens2.tasks.local_models import local_choices, short_names
from sapiens2.training.trainer import train


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory) -> dict[str, Path]:
    """The final folders of two short runs: pose on 5 keypoints, segmentation on 4 classes."""
    from accelerate.state import AcceleratorState

    root = tmp_path_factory.mktemp("fine_tuned")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folders = {}
    for task, write in (("pose", write_pose), ("segment", write_segmentation)):
        AcceleratorState._reset_state(reset_partial_state=True)
        data, model = (
            write(root / f"{task}_data", count=2),
            trainable_checkpoint(root / f"{task}_model", task),
        )
        folders[task] = train(options(task, data, model, root / f"{task}_run", steps=2)).folder
    AcceleratorState._reset_state(reset_partial_state=True)
    torch.set_num_threads(threads)
    return folders


@pytest.fixture(scope="module")
def server(fine_tuned, tiny_mirror, tmp_path_factory):
    local = local_choices(None, [f"pose={fine_tuned['pose']}", f"segment={fine_tuned['segment']}"])
    detector = tiny_detector(tmp_path_factory.mktemp("detector"))
    with running_app(tiny_mirror, detector, tmp_path_factory.mktemp("scratch"), local=local) as running:
        yield running


def test_a_pose_model_with_its_own_keypoints_answers_through_the_api(server, fine_tuned):
    client = server.client()
    choice = _choice(fine_tuned["pose"])
    picture, controlnet, summary, timing, files = client.predict(
        handle_file(str(PHOTOS[0])), size=choice, api_name="/pose"
    )
    assert Path(picture).is_file()
    # The ControlNet picture needs the 308 points: black, with a note saying why.
    assert not np.asarray(Image.open(controlnet)).any() and "308 Sapiens keypoints" in summary
    [exported] = [Path(path) for path in files if path.endswith("_pose.json")]
    document = json.loads(exported.read_text())
    assert document["model"] == choice and timing.endswith(f"· {choice}")
    assert document["persons"]
    for person in document["persons"]:
        assert tuple(keypoint["name"] for keypoint in person["keypoints"]) == POSE_NAMES


def test_a_segmentation_model_with_its_own_classes_answers_through_the_api(server, fine_tuned):
    client = server.client()
    choice = _choice(fine_tuned["segment"])
    overlay, legend, _, _, summary, timing, files = client.predict(
        handle_file(str(PHOTOS[1])), size=choice, parts=["torso", "left_arm"], api_name="/segment"
    )
    assert Path(overlay).is_file() and Path(legend).is_file()
    [labels] = [np.load(path) for path in files if path.endswith(".npy")]
    assert labels.max() < len(CLASS_NAMES)
    [mask] = [np.asarray(Image.open(path)) for path in files if path.endswith("_parts_mask.png")]
    np.testing.assert_array_equal(mask, np.isin(labels, [1, 2]) * np.uint8(255))  # masked by its own names
    assert "Mask of torso, left_arm: " in summary
    model = server.runtime.model(str(fine_tuned["segment"]))
    assert list(model.config.id2label.values()) == list(CLASS_NAMES)


def _choice(folder: Path) -> str:
    """The name a fine-tuned model has in its task's list: its run folder and `final`."""
    return f"{folder.parent.name}/{folder.name}"


def test_fine_tuned_models_are_listed_by_name_never_by_a_server_path(server, fine_tuned):
    """Every visitor sees the model list: a --model folder is named, its absolute path is never shown, and
    the path itself is not accepted as a size."""
    config = server.client().view_api(print_info=False, return_format="dict")
    listed = json.dumps(config)
    assert str(fine_tuned["pose"]) not in listed and str(fine_tuned["pose"].parent) not in listed
    page = requests.get(f"{server.url.rstrip('/')}/config", timeout=30).text
    assert _choice(fine_tuned["pose"]) in page and str(fine_tuned["pose"]) not in page
    with pytest.raises(Exception, match="The request cannot be run"):
        server.client().predict(handle_file(str(PHOTOS[0])), size=str(fine_tuned["pose"]), api_name="/pose")


def test_names_of_fine_tuned_folders_are_short_and_distinct():
    names = short_names(
        [
            Path("/a/runs/pose/final"),
            Path("/b/runs/pose/final"),
            Path("/srv/my-pose"),
            Path("/x/a/b"),
            Path("/a/b"),
        ]
    )
    assert names == ["a/runs/pose/final", "b/runs/pose/final", "my-pose", "x/a/b", "a/b"]
    assert short_names([Path("/home/me/pose_run/final")]) == ["pose_run/final"]


def test_fine_tuned_folders_under_the_checkpoint_dir_become_choices(fine_tuned, tiny_mirror, tmp_path):
    shutil.copytree(fine_tuned["segment"], tmp_path / "me" / "body-parts")
    shutil.copytree(
        tiny_mirror / "facebook" / "sapiens2-seg-0.4b", tmp_path / "facebook" / "sapiens2-seg-0.4b"
    )
    choices = local_choices(tmp_path)
    assert choices == {"segment": {"me/body-parts": str((tmp_path / "me" / "body-parts").resolve())}}
    with pytest.raises(ConfigError, match=r"holds a Sapiens2ForSemanticSegmentation, not a .*PoseEstimation"):
        local_choices(None, [f"pose={fine_tuned['segment']}"])
