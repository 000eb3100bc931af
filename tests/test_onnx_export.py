"""ONNX export: every task's tiny model in ONNX Runtime agrees with this package's float32 forward at
batch 1 and 3, the file passes onnx.checker, and the JSON beside it says what the processing needs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from tiny_models import write_tiny_checkpoint

import sapiens2
from sapiens2.cli import main

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

# A smaller input than the official 1024x768 (set by the preprocessor config, as the export reads it), so
# that each export takes seconds; the pointmap's scale branch is built for it.
SIZE = (256, 192)
TASKS = {  # export name: kind, the output names transformers gives
    "pose": ("pose", ("heatmaps",)),
    "segment": ("seg", ("logits",)),
    "normals": ("normal", ("normals",)),
    "pointmap": ("pointmap", ("pointmaps", "scales")),
    "matting": ("matting", ("alphas", "foregrounds")),
    "features": ("pretrain", ("last_hidden_state", "pooler_output")),
}


def _checkpoint(folder, kind: str, padded: bool = False, **processor):
    write_tiny_checkpoint(folder, kind, size="1b" if kind == "matting" else "0.4b", image_size=SIZE)
    size = {"height": SIZE[0], "width": SIZE[1]}
    transformers.Sapiens2ImageProcessor(size=size, do_pad=padded, **processor).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each task exported once through the command line."""
    root = tmp_path_factory.mktemp("onnx")
    files = {}
    for name, (kind, _) in TASKS.items():
        folder = _checkpoint(root / kind, kind, padded=kind in ("normal", "pointmap"))
        out = root / "out" / f"{name}.onnx"
        assert main(["export", name, "--model", str(folder), "--out", str(out)]) == 0
        files[name] = (folder, out)
    return files


def _relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-12))


@pytest.mark.parametrize("name", list(TASKS))
def test_onnx_runtime_matches_the_float32_forward_at_batch_1_and_3(exported, name):
    folder, out = exported[name]
    onnx.checker.check_model(onnx.load(out), full_check=True)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    expected_names = TASKS[name][1]
    assert [output.name for output in session.get_outputs()] == list(expected_names)
    assert [i.name for i in session.get_inputs()] == ["pixel_values"]
    assert session.get_inputs()[0].shape == ["batch", 3, *SIZE]
    model = sapiens2.from_pretrained(folder, device="cpu", dtype="fp32")
    generator = torch.Generator().manual_seed(1)
    for batch in (1, 3):
        pixels = torch.randn(batch, 3, *SIZE, generator=generator)
        with torch.inference_mode():
            reference = model(pixels)
        answers = session.run(None, {"pixel_values": pixels.numpy()})
        for output_name, answer in zip(expected_names, answers, strict=True):
            expected = getattr(reference, output_name).numpy()
            assert answer.shape == expected.shape
            assert _relative_error(answer, expected) < 1e-4, (output_name, batch)


def test_the_description_holds_what_pre_and_post_processing_need(exported):
    _, out = exported["pose"]
    described = json.loads(out.with_suffix(".json").read_text())
    assert described["input"] == {"name": "pixel_values", "shape": ["batch", 3, *SIZE], "dtype": "float32"}
    pre = described["preprocessing"]
    assert pre["size"] == {"height": SIZE[0], "width": SIZE[1]}
    assert pre["image_mean"] == pytest.approx([123.675 / 255, 116.28 / 255, 103.53 / 255], abs=1e-6)
    assert pre["image_std"] == pytest.approx([58.395 / 255, 57.12 / 255, 57.375 / 255], abs=1e-6)
    assert pre["do_pad"] is False and pre["rescale_factor"] == pytest.approx(1 / 255)
    assert described["outputs"] == [{"name": "heatmaps", "shape": ["batch", 308, SIZE[0] // 4, SIZE[1] // 4]}]
    assert len(described["id2label"]) == 308 and described["id2label"]["0"] == "nose"
    assert [0, 0] not in described["flip_pairs"] and len(described["flip_pairs"]) > 100
    segment = json.loads(exported["segment"][1].with_suffix(".json").read_text())
    assert len(segment["id2label"]) == 29 and segment["id2label"]["0"] == "Background"
    normals = json.loads(exported["normals"][1].with_suffix(".json").read_text())
    assert normals["preprocessing"]["do_pad"] is True and "id2label" not in normals
    assert [
        o["name"] for o in json.loads(exported["pointmap"][1].with_suffix(".json").read_text())["outputs"]
    ] == [
        "pointmaps",
        "scales",
    ]


def test_the_preprocessor_sets_the_normalization_written(tmp_path):
    folder = _checkpoint(tmp_path / "seg", "seg", image_mean=[0.5, 0.5, 0.5], image_std=[0.25, 0.25, 0.25])
    out = tmp_path / "seg.onnx"
    assert main(["export", "seg", "--model", str(folder), "--out", str(out)]) == 0
    pre = json.loads(out.with_suffix(".json").read_text())["preprocessing"]
    assert pre["image_mean"] == [0.5, 0.5, 0.5] and pre["image_std"] == [0.25, 0.25, 0.25]


def test_a_checkpoint_of_another_task_or_a_wrong_file_name_is_refused(exported, tmp_path, capsys):
    folder, _ = exported["pose"]
    assert main(["export", "segment", "--model", str(folder), "--out", str(tmp_path / "x.onnx")]) == 1
    assert "Sapiens2ForPoseEstimation" in capsys.readouterr().out
    assert not (tmp_path / "x.onnx").exists()
    with pytest.raises(SystemExit) as error:
        main(["export", "pose", "--model", str(folder), "--out", str(tmp_path / "x.txt")])
    assert error.value.code == 2
