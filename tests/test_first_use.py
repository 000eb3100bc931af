"""What a newcomer reads and finds on first use: the camera sentence, the offline hint, the 16-bit normals
hint, and no folder left behind by a failed detector download."""

from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from sapiens2.models.hub import offline_instructions
from sapiens2.outputs.exports import write_normals_png
from sapiens2.pipelines import normals
from sapiens2.pipelines.depth import _camera_sentence
from sapiens2.vision import detector
from sapiens2.vision.intrinsics import Intrinsics

# Every proxy a downloader may read points at a closed port of this machine: a download fails at once,
# through ultralytics' real download code, and nothing reaches the network.
CLOSED = "http://127.0.0.1:9"


@pytest.mark.parametrize("value", [-0.0, -0.01, -0.049, 0.04])
def test_the_camera_sentence_never_prints_minus_zero(value):
    sentence = _camera_sentence(Intrinsics(value, value, value, value, 0.1, 10))
    assert "-0.0" not in sentence and "fx 0.0, fy 0.0, cx 0.0, cy 0.0 px" in sentence


def test_the_camera_sentence_keeps_real_negative_values():
    assert "cx -3.2" in _camera_sentence(Intrinsics(500.0, 500.0, -3.2, 10.0, 0.1, 10))


@pytest.mark.parametrize(
    "repo_id, weights",
    [
        ("facebook/sapiens2-pose-0.4b", "model.safetensors"),
        ("facebook/sapiens2-seg-1b", "model.safetensors"),
        ("facebook/sapiens2-pretrain-1b-4k", "sapiens2_1b_4k_pretrain.safetensors"),
    ],
)
def test_the_missing_model_hint_downloads_one_copy_of_the_weights(repo_id, weights):
    hint = offline_instructions(repo_id)
    patterns = f"--include config.json --include preprocessor_config.json --include {weights}"
    assert f"hf download {repo_id} {patterns} --local-dir checkpoints/{repo_id}" in hint
    assert not set(hint) & set("<>*`[]"), "plain text: nothing that HTML or Markdown would swallow"


def test_the_normals_hint_reads_the_16_bit_png_as_written(tmp_path):
    rng = np.random.default_rng(0)
    unit = rng.normal(size=(6, 5, 3)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=2, keepdims=True)
    (path,) = write_normals_png(tmp_path, "photo", unit)
    assert "cv2.imread(path, cv2.IMREAD_UNCHANGED)[..., ::-1]" in normals.SIXTEEN_BIT_HINT
    read = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)[..., ::-1]
    assert read.dtype == np.uint16
    np.testing.assert_allclose(read / 65535 * 2 - 1, unit, atol=2 / 65535)
    with Image.open(path) as opened:  # why the hint is needed: Pillow gives 8 bits per channel
        assert np.asarray(opened).dtype == np.uint8


def test_the_normals_summary_carries_the_16_bit_hint(tiny_mirror, monkeypatch):
    from sapiens2 import Runtime

    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tiny_mirror))
    photo = np.asarray(Image.open(Path(__file__).parents[1] / "assets" / "astronaut.png").convert("RGB"))
    result = Runtime(device="cpu").run("normals", photo[:128, :96], remove_background=False)
    assert result.summary.endswith(normals.SIXTEEN_BIT_HINT)


def test_a_failed_detector_download_leaves_no_empty_weights_folder(tmp_path, monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, CLOSED)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("YOLO_OFFLINE", raising=False)
    folder = tmp_path / "work" / "weights"
    monkeypatch.setattr(detector, "weights_folder", lambda: folder)  # ultralytics' setting, for this test
    monkeypatch.chdir(tmp_path)
    with pytest.raises(detector.DetectorError, match="cannot load detector weights"):
        detector.YoloPersonDetector("yolo11n.pt")._load()
    assert not folder.exists() and not folder.parent.exists()
    assert list(tmp_path.iterdir()) == []


def test_the_first_live_reading_says_it_is_measuring_not_zero_frames_per_second():
    from sapiens2.serving.handlers import live_rate

    assert live_rate([10.0]) == "first frame, measuring the frame rate"
    assert "0.0" not in live_rate([10.0]) and live_rate([]) == live_rate([10.0])
    assert live_rate([10.0, 10.5, 11.0]) == "2.0 frames per second"
    # a full-size model on a CPU: not "0.0 frames per second"
    assert live_rate([0.0, 84.4]) == "84.4 s per frame (0.012 frames per second)"


def test_video_and_live_results_have_no_label_badge_over_the_track_ids():
    import app
    from sapiens2 import Runtime

    demo = app.build_app(Runtime(device="cpu"))
    shown = {block.elem_id: block for block in demo.blocks.values() if getattr(block, "elem_id", None)}
    assert shown["video-result"].show_label is False and shown["live-result"].show_label is False
