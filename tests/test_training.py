"""`sapiens2 train` end to end on tiny models and tiny drawn datasets: every task overfits, checkpoints reload
exactly (in this package and in transformers), resuming equals not stopping, two processes equal one, and
the errors a person can act on."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_datasets import WRITERS
from tiny_models import tiny_config, write_transformers_checkpoint

from sapiens2 import from_pretrained
from sapiens2.tasks.registry import get_task
from sapiens2.training import cli
from sapiens2.training.records import curves_figure, log_interval
from sapiens2.training.trainer import TrainOptions, train

ROOT = Path(__file__).resolve().parents[1]
# The pointmap scale branch halves the patch grid three times: 10x6 patches keep 2 cells at the end.
SIZES = {"depth": (160, 96)}
METRICS = {
    "pose": "pck@0.05",
    "segment": "mIoU",
    "normals": "mean_angle_deg",
    "depth": "abs_rel",
    "matting": "SAD",
}


@pytest.fixture(autouse=True)
def one_thread():
    """One thread per process: much faster for tiny tensors on a shared machine, and deterministic."""
    from accelerate.state import AcceleratorState

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    torch.set_num_threads(threads)
    AcceleratorState._reset_state(reset_partial_state=True)


def trainable_checkpoint(directory: Path, task: str) -> Path:
    """A tiny checkpoint of `task` whose head is 32 channels wide (room to fit a few photos)."""
    kind = get_task(task).kind
    extra = {"image_size": SIZES[task]} if task in SIZES else {}
    config = tiny_config(kind.name, "0.4b" if "0.4b" in kind.sizes else kind.sizes[0], **extra)
    for key in ("upsample_out_channels", "conv_out_channels"):
        config["head_config"][key] = [32] * len(config["head_config"][key])
    return write_transformers_checkpoint(directory, config)


def options(task: str, data: Path, model: Path, out: Path, **changes) -> TrainOptions:
    values = dict(
        task=task,
        data=data,
        model=str(model),
        out=out,
        steps=6,
        batch_size=2,
        input_size=SIZES.get(task, (64, 48)),
        new_labels=True,
        workers=0,
        log_every=1,
        progress=False,
    )
    return TrainOptions(**(values | changes))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tiny dataset and a tiny checkpoint per task."""
    root = tmp_path_factory.mktemp("training")
    for task, write in WRITERS.items():
        write(root / f"{task}_data", count=2)
        trainable_checkpoint(root / f"{task}_model", task)
    return root


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("task", list(WRITERS))
def test_every_task_overfits_and_its_checkpoint_reloads_exactly(task, workspace, tmp_path):
    data, model = workspace / f"{task}_data", workspace / f"{task}_model"
    settings = options(task, data, model, tmp_path, steps=60, lr=3e-3, warmup=0, augment=False, val=data)
    run = train(settings)
    rows = _rows(tmp_path)
    losses = [row["loss"] for row in rows if row["kind"] == "train"]
    assert len(losses) == 60 and losses[-1] <= 0.2 * losses[0], (losses[0], losses[-1])
    [validation] = [row for row in rows if row["kind"] == "val"]
    assert METRICS[task] in validation and validation["step"] == 60
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert sorted(p.name for p in run.folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
    ]
    pixel_values = torch.randn(2, 3, *settings.input_size, generator=torch.Generator().manual_seed(0))
    reloaded = from_pretrained(run.folder, device="cpu", dtype=torch.float32)
    run.model.eval()
    with torch.inference_mode():
        expected, actual = run.model(pixel_values), reloaded(pixel_values)
    for name, value in vars(expected).items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(getattr(actual, name), value), name


@pytest.mark.parametrize("task", ["pose", "segment"])
def test_transformers_loads_a_model_with_its_own_labels(task, workspace, tmp_path):
    import transformers

    run = train(options(task, workspace / f"{task}_data", workspace / f"{task}_model", tmp_path, steps=2))
    config = json.loads((run.folder / "config.json").read_text())
    reference = getattr(transformers, config["architectures"][0]).from_pretrained(run.folder).eval()
    ours = from_pretrained(run.folder, device="cpu", dtype=torch.float32)
    pixel_values = torch.randn(1, 3, 64, 48, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, actual = reference(pixel_values), ours(pixel_values)
    field = "heatmaps" if task == "pose" else "logits"
    assert (
        float((getattr(actual, field) - getattr(expected, field)).norm() / getattr(expected, field).norm())
        < 1e-5
    )
    if task == "pose":
        assert reference.config.id2label[1] == "left_hand" and config["flip_pairs"] == [[1, 2], [3, 4]]
        assert config["skeleton"] == [[0, 1], [0, 2], [0, 3], [0, 4]]
        assert getattr(actual, field).shape[1] == 5
    else:
        assert list(reference.config.id2label.values()) == ["background", "torso", "left_arm", "right_arm"]
        assert config["palette"][1] == [200, 40, 40]
    processor = transformers.AutoImageProcessor.from_pretrained(run.folder)
    assert (processor.size.height, processor.size.width) == (64, 48)


def test_resuming_after_a_stop_gives_the_uninterrupted_run(workspace, tmp_path):
    data, model = workspace / "segment_data", workspace / "segment_model"
    whole = train(options("segment", data, model, tmp_path / "whole", save_every=3))
    stopped = train(options("segment", data, model, tmp_path / "parts"), stop=lambda step: step == 3)
    assert stopped.step == 3 and stopped.folder.name == "checkpoint-3"
    resumed = train(options("segment", data, model, tmp_path / "parts", resume=tmp_path / "parts", workers=2))
    expected, actual = (
        load_file(whole.folder / "model.safetensors"),
        load_file(resumed.folder / "model.safetensors"),
    )
    assert all(torch.equal(actual[name], expected[name]) for name in expected)
    steps = [row["step"] for row in _rows(tmp_path / "parts") if row["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_a_short_run_logs_every_step(workspace, tmp_path, capsys):
    arguments = ["segment", "--data", workspace / "segment_data", "--model", workspace / "segment_model"]
    arguments += ["--out", tmp_path, "--steps", "4", "--input-size", "64x48", "--new-labels"]
    assert _main(capsys, *arguments, "--workers", "0", "--no-progress")[0] == 0
    assert [row["step"] for row in _rows(tmp_path) if row["kind"] == "train"] == [1, 2, 3, 4]


def test_the_log_interval_gives_a_short_run_20_points_and_keeps_what_was_asked():
    assert [log_interval(None, steps) for steps in (4, 100, 1000, 50_000)] == [1, 5, 10, 10]
    assert log_interval(7, 4) == 7


def test_curves_mark_each_logged_point_so_that_one_point_shows():
    from matplotlib import pyplot

    figure = curves_figure([{"kind": "train", "step": 5, "loss": 1.0, "loss/dice": 1.0, "lr": 1e-4}])
    loss_axis, lr_axis = figure.axes[:2]
    assert len(loss_axis.lines) == 2 and len(lr_axis.lines) == 1
    assert all(line.get_marker() not in (None, "", "None") for line in [*loss_axis.lines, *lr_axis.lines])
    pyplot.close(figure)


def _inert(name: str) -> bool:
    """Biases of decode-head convs followed by InstanceNorm: they change no output, their true gradient is 0,
    and Adam turns its float noise into steps of +-lr, so they differ between reduction orders."""
    return name.startswith("decode_head.conv_layers.") and name.endswith(".bias")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_reach_the_parameters_of_one_with_the_same_global_batch(workspace, tmp_path):
    data, model = workspace / "segment_data", workspace / "segment_model"
    one = train(options("segment", data, model, tmp_path / "one", steps=3, batch_size=2))
    # `accelerate launch --cpu` starts a single process unless MPI is set up; the torchrun launcher starts
    # real processes, which train data-parallel on the CPU through gloo when there is no GPU.
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["--main_process_port", str(_free_port()), "-m", "sapiens2", "train", "segment"]
    command += ["--data", str(data), "--model", str(model), "--out", str(tmp_path / "two"), "--steps", "3"]
    command += [
        "--batch-size",
        "1",
        "--input-size",
        "64x48",
        "--new-labels",
        "--workers",
        "0",
        "--no-progress",
    ]
    environment = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "2 processes on cpu" in finished.stdout + finished.stderr
    expected = load_file(one.folder / "model.safetensors")
    actual = load_file(tmp_path / "two" / "final" / "model.safetensors")
    initial = from_pretrained(model, device="cpu", dtype=torch.float32).state_dict()
    for name, value in expected.items():
        if _inert(name):
            continue
        start = initial.get(name)
        if start is not None and start.shape == value.shape:
            # Adam scales each gradient to about one step of lr, so the float noise of another reduction
            # order moves a weight whose gradient is near zero by a fraction of a step (0.2% seen).
            tolerance = 0.01 * float((value - start).abs().max())
        else:  # the new head: no weights to start from
            tolerance = 1e-5 * float(value.abs().max())
        assert float((actual[name] - value).abs().max()) <= tolerance, name
    pixel_values = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(0))
    two = from_pretrained(tmp_path / "two" / "final", device="cpu", dtype=torch.float32)
    with torch.inference_mode():
        reference, logits = one.model.eval()(pixel_values).logits, two(pixel_values).logits
    assert float((logits - reference).abs().max()) <= 1e-5 * float(reference.abs().max())


# ---- errors a person can act on -------------------------------------------------------------------------


def _main(capsys, *arguments: str) -> tuple[int, str]:
    status = cli.main([str(argument) for argument in arguments])
    return status, capsys.readouterr().err


def test_keypoint_count_differing_from_the_model_needs_new_labels(workspace, tmp_path, capsys):
    arguments = ["pose", "--data", workspace / "pose_data", "--model", workspace / "pose_model"]
    status, message = _main(capsys, *arguments, "--out", tmp_path, "--steps", "1", "--input-size", "64x48")
    assert status == 1
    assert "The dataset has 5 keypoints but --model" in message and "predicts 308" in message
    assert "Pass --new-labels" in message


def test_a_checkpoint_with_8_pixel_patches_trains_at_its_own_size(workspace, tmp_path):
    """What inference runs, training takes: no --input-size, patch size 8, image_size 96x72."""
    config = tiny_config(get_task("pose").kind.name, "0.4b", image_size=(96, 72), patch_size=8)
    model = write_transformers_checkpoint(tmp_path / "model", config)
    run = train(options("pose", workspace / "pose_data", model, tmp_path / "out", steps=1, input_size=None))
    with torch.inference_mode():
        heatmaps = run.model.eval()(torch.zeros(1, 3, 96, 72)).heatmaps
    assert heatmaps.shape[-2:] == (48, 36)  # 12x9 patches doubled twice: the targets had this size


def test_a_size_the_model_cannot_take_names_where_it_came_from(workspace, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(workspace / "depth_model", model)
    (model / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 64, "width": 48}}))
    arguments = ["depth", "--data", workspace / "depth_data", "--model", model, "--out", tmp_path / "out"]
    status, message = _main(capsys, *arguments, "--steps", "1", "--workers", "0", "--no-progress")
    assert status == 1 and "--input-size 64x48" not in message
    assert "the size in the checkpoint's preprocessor_config.json 64x48 does not fit" in message
    assert "train at --input-size 160x96" in message


def test_the_offline_advice_names_flags_that_train_accepts(workspace, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SAPIENS2_CHECKPOINT_DIR", raising=False)
    arguments = ["segment", "--data", workspace / "segment_data", "--model", "example/parts-model"]
    arguments += ["--steps", "1", "--input-size", "64x48", "--new-labels", "--workers", "0", "--no-progress"]
    status, message = _main(capsys, *arguments, "--out", tmp_path / "missing")
    assert status == 1 and "--checkpoint-dir checkpoints" in message
    accepted = {flag for action in cli.build_parser()._actions for flag in action.option_strings}
    ours = re.sub(r"\(hf download [^)]*\)", "", message)  # the download command's own flags aside
    advised = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", ours))
    assert advised and advised <= accepted, advised - accepted
    monkeypatch.chdir(tmp_path)
    shutil.copytree(workspace / "segment_model", tmp_path / "checkpoints" / "example" / "parts-model")
    status, message = _main(capsys, *arguments, "--out", tmp_path / "run", "--checkpoint-dir", "checkpoints")
    assert status == 0, message
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_bad_resume_folder_and_reused_out_folder(workspace, tmp_path, capsys):
    arguments = ["segment", "--data", workspace / "segment_data", "--model", workspace / "segment_model"]
    arguments += ["--steps", "1", "--input-size", "64x48", "--new-labels", "--workers", "0", "--no-progress"]
    status, message = _main(capsys, *arguments, "--out", tmp_path / "run", "--resume", tmp_path)
    assert status == 1 and f"--resume {tmp_path}: no checkpoint there" in message
    assert _main(capsys, *arguments, "--out", tmp_path / "run")[0] == 0
    status, message = _main(capsys, *arguments, "--out", tmp_path / "run")
    assert status == 1 and "already holds checkpoints of a run: add --resume" in message
    status, message = _main(capsys, *arguments, "--out", tmp_path / "run", "--resume", "--seed", "1")
    assert status == 1 and "it was trained with seed=0, this run has 1" in message


def test_labels_out_of_range_name_the_mask(workspace, tmp_path, capsys):
    import cv2
    import numpy as np

    data = tmp_path / "data"
    shutil.copytree(workspace / "segment_data", data)
    cv2.imwrite(str(data / "masks" / "photo_1.png"), np.full((60, 44), 9, np.uint8))
    arguments = ["segment", "--data", data, "--model", workspace / "segment_model", "--out", tmp_path / "out"]
    status, message = _main(
        capsys, *arguments, "--steps", "2", "--input-size", "64x48", "--new-labels", "--workers", "0"
    )
    assert status == 1 and "photo_1.png: class ids [9] are out of range: the model has 4 classes" in message


def test_out_of_memory_suggests_what_to_change(workspace, tmp_path, capsys, monkeypatch):
    # No GPU here: the out-of-memory error of a CUDA forward is simulated by raising it from the loss.
    from sapiens2.training.tasks import TrainingTask

    def out_of_memory(*_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(TrainingTask, "loss_terms", out_of_memory)
    arguments = ["normals", "--data", workspace / "normals_data", "--model", workspace / "normals_model"]
    status, message = _main(capsys, *arguments, "--out", tmp_path, "--steps", "1", "--input-size", "64x48")
    assert status == 1 and "Out of GPU memory" in message and "--grad-checkpointing" in message
    assert "smaller --batch-size" in message


def test_train_command_is_reached_through_python_m_sapiens2():
    finished = subprocess.run(
        [sys.executable, "-m", "sapiens2", "train", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert finished.returncode == 0
    assert "--grad-checkpointing" in finished.stdout and "DIR/annotations.json" in finished.stdout


def test_a_pretrained_backbone_gets_a_new_official_head(workspace, tmp_path):
    from tiny_models import write_tiny_checkpoint

    backbone = write_tiny_checkpoint(tmp_path / "pretrain", get_task("features").kind.name)
    run = train(options("segment", workspace / "segment_data", backbone, tmp_path / "out", steps=1))
    config = json.loads((run.folder / "config.json").read_text())
    assert config["architectures"] == [get_task("segment").kind.architecture]
    assert config["head_config"]["upsample_out_channels"] == [512, 256, 128, 64]  # the official layout
    assert len(config["id2label"]) == 4
    pretrained = load_file(backbone / "model.safetensors")
    trained = from_pretrained(run.folder, device="cpu", dtype=torch.float32).state_dict()
    # One step from the pretrained weights: the backbone moved by at most a few learning rates.
    name = "blocks.1.attn.wq.weight"
    assert float((trained[f"backbone.{name}"] - pretrained[name]).abs().max()) < 1e-3


def test_a_one_point_validation_panel_sits_in_the_run_with_its_value_written():
    from matplotlib import pyplot

    train = [{"kind": "train", "step": step, "loss": 1.0 / step, "lr": 1e-4} for step in range(1, 11)]
    figure = curves_figure([*train, {"kind": "val", "step": 10, "epoch": 1, "pck": 0.42, "error_px": 0.0}])
    loss_axis, _, pck_axis, error_axis = figure.axes
    figure.canvas.draw()
    for axis in (pck_axis, error_axis):
        assert axis.get_xlim() == loss_axis.get_xlim() and axis.get_xlim()[0] <= 1 <= 10 <= axis.get_xlim()[1]
        assert all(float(tick).is_integer() for tick in axis.get_xticks()), axis.get_xticks()
    assert [text.get_text() for text in pck_axis.texts] == ["0.42"]
    low, high = pck_axis.get_ylim()
    assert low < 0.42 < high and high - low > 0.1, "not an axis of rounding noise around one value"
    assert [text.get_text() for text in error_axis.texts] == ["0"] and error_axis.get_ylim() == (-1.0, 1.0)
    pyplot.close(figure)
