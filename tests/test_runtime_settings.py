"""How the runtime picks a checkpoint's input size: its preprocessor_config.json, else its config.json."""

import json

import pytest
from tiny_models import write_tiny_checkpoint

from sapiens2.errors import ConfigError
from sapiens2.models.kinds import POINTMAP, SEG
from sapiens2.runtime.runtime import Runtime
from sapiens2.vision.images import load_image

PHOTO = "assets/grace_hopper.jpg"


@pytest.fixture
def runtime():
    return Runtime(device="cpu", dtype="fp32")


def test_a_checkpoint_without_processor_config_runs_at_its_own_image_size(runtime, tmp_path):
    # A pointmap model whose scale branch only takes 256x192 inputs, laid out as the README's offline folders.
    folder = write_tiny_checkpoint(tmp_path / "pointmap", "pointmap", image_size=(256, 192))
    assert not (folder / "preprocessor_config.json").exists()
    settings = runtime.settings(str(folder), POINTMAP)
    assert settings.size == (256, 192) and settings.do_pad
    result = runtime.run("depth", load_image(PHOTO), model=str(folder), remove_background=False)
    assert result.prediction.pointmap.shape[:2] == (600, 512)
    assert result.notes == [
        "pointmap has no preprocessor_config.json: assumed 256x192 inputs (resized and padded, 0-255 scaled "
        "to 0-1, normalized with the ImageNet mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225))."
    ]


def test_a_processor_size_the_model_cannot_take_is_refused_with_a_sentence(runtime, tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "pointmap", "pointmap", image_size=(256, 192))
    (folder / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 512, "width": 384}}))
    with pytest.raises(ConfigError) as refused:
        runtime.settings(str(folder), POINTMAP)
    message = str(refused.value)
    assert "was built for 256x192 inputs" in message and "cannot run at the 512x384" in message
    assert str(tmp_path) not in message, "the sentence names the checkpoint, not the server's folders"


def test_a_processor_size_other_than_the_models_runs_with_a_note(runtime, tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "seg", "seg", image_size=(256, 192))
    (folder / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 128, "width": 96}}))
    assert runtime.settings(str(folder), SEG).size == (128, 96)
    result = runtime.run("segment", load_image(PHOTO), model=str(folder))
    assert result.notes == [
        "The model runs at 128x96 (its preprocessor_config.json) but was built for 256x192 (its "
        "config.json); results may be less accurate."
    ]


@pytest.mark.parametrize("flag", [True, False])
def test_a_detector_that_cannot_be_used_is_refused_at_start_up_naming_where_it_came_from(
    flag, tmp_path, monkeypatch
):
    import argparse

    from sapiens2.runtime.arguments import add_runtime_arguments, runtime_from_arguments

    parser = argparse.ArgumentParser()
    add_runtime_arguments(parser)
    missing = str(tmp_path / "nowhere.pt")
    if flag:
        args = parser.parse_args(["--device", "cpu", "--detector", missing])
    else:
        monkeypatch.setenv("SAPIENS2_DETECTOR", missing)
        args = parser.parse_args(["--device", "cpu"])
    with pytest.raises(ConfigError, match="--detector" if flag else r"\$SAPIENS2_DETECTOR") as refused:
        runtime_from_arguments(args)
    assert "nowhere.pt" in str(refused.value)
