"""Checkpoint loading: directories, repo ids, bare original files, the Hugging Face cache, every failure."""

from __future__ import annotations

import json
import re
import shutil
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import httpx
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tiny_models import tiny_4k_config, tiny_config, write_tiny_4k_checkpoint, write_tiny_checkpoint

import sapiens2
from sapiens2.errors import CheckpointError, CheckpointNotFoundError, ConfigError
from sapiens2.models import device, hub, hub_access, presets
from sapiens2.models import weights as weights_module
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.kinds import KINDS
from sapiens2.models.layers import rope_periods
from sapiens2.models.modeling import build_model

KIND_SIZES = (
    ("pretrain", "0.1b"),
    ("pose", "1b"),
    ("seg", "0.4b"),
    ("normal", "5b"),
    ("pointmap", "0.8b"),
    ("matting", "1b"),
)
REPO = "facebook/sapiens2-pose-0.4b"
# Official 0.4b pose: backbone 395,450,368 parameters (official Sapiens2 "sapiens2_0.4b" built on the meta
# device) plus the keypoints308 head: deconvs 1024->1024->768 (4x4, no bias), 1x1 convs 768->512->512->256,
# and the 256->308 predictor.
OFFICIAL_POSE_04B_PARAMETERS = 395_450_368 + (1024 + 768) * 1024 * 16 + 393_728 + 262_656 + 131_328 + 79_156


@pytest.fixture
def no_checkpoint_dir(monkeypatch):
    monkeypatch.delenv(hub.CHECKPOINT_DIR_ENV, raising=False)


@pytest.fixture
def pose_dir(tmp_path) -> Path:
    return write_tiny_checkpoint(tmp_path / "pose", "pose")


def assert_loaded_from(model: torch.nn.Module, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Every model tensor is the file's tensor, in `dtype`, on the CPU; nothing is left on the meta device."""
    state = model.state_dict()
    # A file without the RoPE periods (transformers' files) gets them computed from the config.
    periods = {name for name in state.keys() - weights.keys() if name.endswith("rope_embed.periods")}
    assert state.keys() - periods == weights.keys()
    for name in periods:
        rope = model.get_submodule(name.removesuffix(".periods"))
        expected = rope_periods(rope.head_dim, rope.theta).to(dtype)
        torch.testing.assert_close(state[name], expected, rtol=0, atol=0, msg=name)
    for name, tensor in {name: state[name] for name in weights}.items():
        assert tensor.device.type == "cpu" and tensor.dtype == dtype, name
        torch.testing.assert_close(tensor, weights[name].to(dtype), rtol=0, atol=0, msg=name)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])


# ---- sources ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task, size", KIND_SIZES)
def test_directory_loads_every_tensor_strictly_in_eval_mode(tmp_path, task, size):
    directory = write_tiny_checkpoint(tmp_path, task, size=size, image_size=(160, 96))
    model = sapiens2.from_pretrained(directory, device="cpu")
    assert not model.training
    assert type(model).__name__ == KINDS[task].architecture
    assert_loaded_from(model, load_file(directory / hub.WEIGHTS_NAME), torch.float32)


def test_repo_id_is_found_in_checkpoint_dir(tiny_mirror, monkeypatch):
    monkeypatch.setenv(hub.CHECKPOINT_DIR_ENV, str(tiny_mirror))
    resolved = sapiens2.resolve_checkpoint("facebook/sapiens2-seg-1b")
    assert resolved == hub.ResolvedCheckpoint(
        tiny_mirror / "facebook/sapiens2-seg-1b/config.json",
        (tiny_mirror / "facebook/sapiens2-seg-1b/model.safetensors",),
        "facebook/sapiens2-seg-1b",
    )
    model = sapiens2.from_pretrained("facebook/sapiens2-seg-1b", device="cpu")
    assert_loaded_from(model, load_file(resolved.weight_paths[0]), torch.float32)
    assert sapiens2.checkpoint_download_size("facebook/sapiens2-seg-1b") == 0


def test_sharded_directory_loads_like_a_single_file(pose_dir, tmp_path):
    weights = load_file(pose_dir / hub.WEIGHTS_NAME)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(pose_dir / hub.CONFIG_NAME, sharded)
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in shards.items():
        save_file({n: weights[n] for n in shard_names}, sharded / shard)
    weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
    (sharded / hub.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert_loaded_from(sapiens2.from_pretrained(sharded, device="cpu"), weights, torch.float32)

    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointNotFoundError, match="model-00002-of-00002.safetensors"):
        sapiens2.from_pretrained(sharded, device="cpu")


def test_bare_original_file_uses_the_preset_named_by_the_file(pose_dir, tmp_path, monkeypatch):
    tiny = tiny_config("pose")
    monkeypatch.setattr(presets, "preset_config", lambda size, task: tiny if task == "pose" else {})
    weights = load_file(pose_dir / hub.WEIGHTS_NAME)
    bare = tmp_path / "sapiens2_0.4b_pose.safetensors"
    # Original files also carry the RoPE periods the model was trained with, which the model then uses.
    weights["backbone.rope_embed.periods"] = torch.tensor([1.0, 9.875])
    save_file(weights, bare)

    assert sapiens2.resolve_checkpoint(bare) == hub.ResolvedCheckpoint(None, (bare,), None)
    model = sapiens2.from_pretrained(bare, device="cpu")
    assert_loaded_from(model, weights, torch.float32)
    assert model.backbone.rope_embed.values() == (1.0, 9.875)
    assert model.config.flip_pairs and model.config.num_labels == 308


REPO_4K = "facebook/sapiens2-pretrain-1b-4k"
ORIGINAL_4K = "sapiens2_1b_4k_pretrain.safetensors"


@pytest.fixture
def tiny_4k_preset(monkeypatch):
    """The built-in 1b-4k preset replaced by a tiny one (same layout, tiny widths)."""
    real, tiny = presets.preset_config, tiny_4k_config()
    monkeypatch.setattr(
        presets, "preset_config", lambda size, task: tiny if size == "1b-4k" else real(size, task)
    )


def test_4k_config_loads_and_its_preset_is_named_by_the_original_file(tmp_path, tiny_4k_preset):
    directory = write_tiny_4k_checkpoint(tmp_path / "dir")
    model = sapiens2.from_pretrained(directory, device="cpu")
    assert model.config.use_tokenizer and len(model.tokenizer.blocks) == 2
    assert_loaded_from(model, load_file(directory / hub.WEIGHTS_NAME), torch.float32)
    bare = shutil.copy(directory / hub.WEIGHTS_NAME, tmp_path / ORIGINAL_4K)
    assert_loaded_from(sapiens2.from_pretrained(bare, device="cpu"), load_file(bare), torch.float32)


def test_4k_repo_holding_only_its_original_file_loads(tmp_path, monkeypatch, tiny_4k_preset, reachable_hub):
    """An official repo without config.json (the 4K backbone is not in transformers) is read from its
    original file, in the checkpoint folder or on the Hub."""
    local = write_tiny_4k_checkpoint(tmp_path / "mirror" / REPO_4K, file_name=ORIGINAL_4K)
    weights = load_file(local / ORIGINAL_4K)
    monkeypatch.setenv(hub.CHECKPOINT_DIR_ENV, str(tmp_path / "mirror"))
    assert sapiens2.resolve_checkpoint(REPO_4K) == hub.ResolvedCheckpoint(
        None, (local / ORIGINAL_4K,), REPO_4K
    )
    assert_loaded_from(sapiens2.from_pretrained(REPO_4K, device="cpu"), weights, torch.float32)

    monkeypatch.delenv(hub.CHECKPOINT_DIR_ENV)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    asked = []

    def fake_download(repo_id, filename, **kwargs):
        asked.append(filename)
        if filename != ORIGINAL_4K:
            raise RemoteEntryNotFoundError("absent", response=http_response(404))
        return str(local / ORIGINAL_4K)

    monkeypatch.setattr(hub, "hf_hub_download", fake_download)
    assert_loaded_from(sapiens2.from_pretrained(REPO_4K, device="cpu"), weights, torch.float32)
    assert asked == [hub.CONFIG_NAME, ORIGINAL_4K]

    class FakeApi:
        def model_info(self, repo_id, *, revision, files_metadata):
            names = {ORIGINAL_4K: 3_213_000_000, "README.md": 10}
            return SimpleNamespace(siblings=[SimpleNamespace(rfilename=n, size=s) for n, s in names.items()])

    monkeypatch.setattr(hub, "HfApi", FakeApi)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-home"))
    assert sapiens2.checkpoint_download_size(REPO_4K) == 3_213_000_000


def test_repo_without_config_nor_original_file_reports_the_missing_config(monkeypatch, no_checkpoint_dir):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def fake_download(repo_id, filename, **kwargs):
        raise RemoteEntryNotFoundError("absent", response=http_response(404))

    monkeypatch.setattr(hub, "hf_hub_download", fake_download)
    with pytest.raises(CheckpointNotFoundError, match=rf"{REPO_4K} has no file config.json"):
        sapiens2.from_pretrained(REPO_4K, device="cpu")


def test_real_pose_preset_has_the_official_parameter_count_and_checkpoint_names(pose_dir):
    config = Sapiens2Config.from_dict(presets.config_for_checkpoint_name("sapiens2_0.4b_pose.safetensors"))
    with torch.device("meta"):
        model = build_model(config)
    assert sum(p.numel() for p in model.parameters()) == OFFICIAL_POSE_04B_PARAMETERS

    # Same tensor names as a checkpoint saved by transformers, whatever the block count.
    def per_block(names):
        return {re.sub(r"blocks\.\d+\.", "blocks.N.", name) for name in names}

    with safe_open(pose_dir / hub.WEIGHTS_NAME, framework="pt") as file:
        assert per_block(model.state_dict()) - {"backbone.rope_embed.periods"} == per_block(file.keys())
    assert len(model.backbone.blocks) == 24
    assert config.num_labels == 308 and config.image_size == (1024, 768)


@pytest.mark.parametrize("size, task", presets.available())
def test_every_preset_builds_on_the_meta_device(size, task):
    with torch.device("meta"):
        model = build_model(Sapiens2Config.from_dict(presets.preset_config(size, task)))
    assert type(model).__name__ == KINDS[task].architecture


@pytest.mark.parametrize(
    "name, expected",
    [
        ("sapiens2_0.4b_pose.safetensors", ("0.4b", "pose")),
        ("/ckpt/seg/sapiens2_5b_seg.safetensors", ("5b", "seg")),
        ("Sapiens2_1B_Pointmap.safetensors", ("1b", "pointmap")),
        ("sapiens2_0.1b_pretrain.safetensors", ("0.1b", "pretrain")),
        ("sapiens2_1b_4k_pretrain.safetensors", ("1b-4k", "pretrain")),
    ],
)
def test_checkpoint_names_parse(name, expected):
    assert presets.parse_checkpoint_name(name) == expected


@pytest.mark.parametrize(
    "name, message",
    [
        ("model.safetensors", "cannot tell the model"),
        ("sapiens2_1b_albedo.safetensors", "no built-in preset for Sapiens2 1b albedo"),
        ("sapiens2_0.4b_4k_pretrain.safetensors", "no built-in preset for Sapiens2 0.4b-4k pretrain"),
        ("sapiens2_1b_4k_pose.safetensors", "no built-in preset for Sapiens2 1b-4k pose"),
        ("sapiens2_0.1b_pose.safetensors", "no built-in preset"),
        ("sapiens2_2b_seg.safetensors", "no built-in preset"),
    ],
)
def test_unknown_checkpoint_names_are_config_errors(name, message):
    with pytest.raises(ConfigError, match=message):
        presets.config_for_checkpoint_name(name)


def test_bare_file_with_an_unknown_name_names_the_file(pose_dir, tmp_path):
    bare = tmp_path / "weights.safetensors"
    shutil.copy(pose_dir / hub.WEIGHTS_NAME, bare)
    with pytest.raises(ConfigError, match="weights.safetensors"):
        sapiens2.from_pretrained(bare, device="cpu")


# ---- dtype, device, init, progress ------------------------------------------------------------------------


def _copy_with(pose_dir: Path, directory: Path, weights_dtype: torch.dtype, config_dtype: str | None) -> Path:
    """The tiny pose checkpoint with its weights in `weights_dtype` and config.json's dtype set or removed."""
    directory.mkdir()
    config = json.loads((pose_dir / hub.CONFIG_NAME).read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = config_dtype
    (directory / hub.CONFIG_NAME).write_text(json.dumps(config))
    weights = {n: t.to(weights_dtype) for n, t in load_file(pose_dir / hub.WEIGHTS_NAME).items()}
    save_file(weights, directory / hub.WEIGHTS_NAME)
    return directory


@pytest.mark.parametrize("native_bf16", [False, True])
def test_library_default_precision_is_the_checkpoints_as_in_transformers(
    pose_dir, tmp_path, monkeypatch, native_bf16
):
    """`from_pretrained` without dtype loads what transformers loads, whatever the CPU and SAPIENS2_DTYPE (the
    app's and command line's setting): config.json's dtype, else the weights' own."""
    monkeypatch.setenv("SAPIENS2_DTYPE", "bf16")
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: native_bf16)
    cases = {
        "float32": (pose_dir, torch.float32),
        "bf16 weights, no dtype": (
            _copy_with(pose_dir, tmp_path / "a", torch.bfloat16, None),
            torch.bfloat16,
        ),
        "fp32 weights, dtype bfloat16": (
            _copy_with(pose_dir, tmp_path / "b", torch.float32, "bfloat16"),
            torch.bfloat16,
        ),
    }
    for case, (directory, expected) in cases.items():
        ours = sapiens2.from_pretrained(directory, device="cpu")
        reference = transformers.Sapiens2ForPoseEstimation.from_pretrained(directory)
        assert {t.dtype for t in ours.state_dict().values() if t.is_floating_point()} == {expected}, case
        assert next(reference.parameters()).dtype == expected, case
        auto = sapiens2.from_pretrained(directory, device="cpu", dtype="auto")
        assert next(auto.parameters()).dtype == expected, case
    weights = load_file(pose_dir / hub.WEIGHTS_NAME)
    for dtype in (torch.bfloat16, "bf16"):
        model = sapiens2.from_pretrained(pose_dir, device="cpu", dtype=dtype)
        assert_loaded_from(model, weights, torch.bfloat16)
        with torch.inference_mode():
            heatmaps = model(torch.zeros(1, 3, 64, 48, dtype=torch.bfloat16)).heatmaps
        assert heatmaps.dtype == torch.bfloat16 and torch.isfinite(heatmaps.float()).all()


def test_bare_original_file_loads_in_its_own_precision(pose_dir, tmp_path, monkeypatch):
    tiny = tiny_config("pose")
    monkeypatch.setattr(presets, "preset_config", lambda size, task: tiny if task == "pose" else {})
    weights = {n: t.to(torch.bfloat16) for n, t in load_file(pose_dir / hub.WEIGHTS_NAME).items()}
    bare = tmp_path / "sapiens2_0.4b_pose.safetensors"
    save_file(weights, bare)
    assert_loaded_from(sapiens2.from_pretrained(bare, device="cpu"), weights, torch.bfloat16)


def test_unknown_config_dtype_is_refused_with_the_way_out(pose_dir, tmp_path):
    directory = _copy_with(pose_dir, tmp_path / "f64", torch.float32, "float64")
    with pytest.raises(ConfigError, match=r"dtype 'float64' is not a precision this package runs"):
        sapiens2.from_pretrained(directory, device="cpu")
    asked = sapiens2.from_pretrained(directory, device="cpu", dtype="fp32")
    assert next(asked.parameters()).dtype == torch.float32


@pytest.mark.parametrize(
    ("asked", "env", "native_bf16", "expected", "reason"),
    [
        (None, None, True, torch.bfloat16, "natively"),
        (None, None, False, torch.float32, "no native bf16"),
        ("fp32", None, True, torch.float32, "as asked"),
        (torch.float16, None, False, torch.float16, "as asked"),
        (None, "bf16", False, torch.bfloat16, "SAPIENS2_DTYPE"),
        ("fp32", "bf16", True, torch.float32, "as asked"),
    ],
)
def test_cpu_precision_rule_and_its_reason(monkeypatch, asked, env, native_bf16, expected, reason):
    monkeypatch.delenv("SAPIENS2_DTYPE", raising=False)
    if env:
        monkeypatch.setenv("SAPIENS2_DTYPE", env)
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: native_bf16)
    dtype, why = device.choose_dtype(asked, torch.device("cpu"))
    assert dtype == expected and reason in why


def test_native_bf16_is_read_from_the_cpu_capabilities(monkeypatch):
    for flags, native in [({"avx512_bf16": True}, True), ({"amx_bf16": True}, True), ({"avx2": True}, False)]:
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda flags=flags: flags)
        assert device.cpu_has_native_bf16() is (native and torch.backends.mkldnn.is_available())


def test_bfloat16_file_loads_as_float32(pose_dir, tmp_path):
    weights = {n: t.to(torch.bfloat16) for n, t in load_file(pose_dir / hub.WEIGHTS_NAME).items()}
    directory = tmp_path / "bf16"
    directory.mkdir()
    shutil.copy(pose_dir / hub.CONFIG_NAME, directory)
    save_file(weights, directory / hub.WEIGHTS_NAME)
    for dtype in (torch.float32, torch.bfloat16):
        assert_loaded_from(sapiens2.from_pretrained(directory, device="cpu", dtype=dtype), weights, dtype)


def test_tensors_read_in_many_pieces_are_the_files(pose_dir, monkeypatch):
    monkeypatch.setattr(weights_module, "CHUNK_BYTES", 36)  # every tensor read and cast in pieces of 9 floats
    weights = load_file(pose_dir / hub.WEIGHTS_NAME)
    for dtype in (torch.float32, torch.bfloat16):
        assert_loaded_from(sapiens2.from_pretrained(pose_dir, device="cpu", dtype=dtype), weights, dtype)


def test_q_k_and_v_are_read_into_one_tensor_without_a_copy(pose_dir, monkeypatch):
    read: dict[str, torch.Tensor] = {}

    def recording(*args, **kwargs):
        read.update(weights_module.read_state_dict(*args, **kwargs))
        return read

    monkeypatch.setattr(hub, "read_state_dict", recording)
    for dtype in (torch.float32, torch.bfloat16):
        model = sapiens2.from_pretrained(pose_dir, device="cpu", dtype=dtype)
        attention = model.backbone.blocks[0].attn
        fused, _ = attention.qkv_projection()
        rows = [attention.wq.weight, attention.wk.weight, attention.wv.weight]
        assert torch.equal(fused, torch.cat(rows))
        # The model holds the very memory the weights were read into: no second copy was made.
        assert fused.data_ptr() == read["backbone.blocks.0.attn.wq.weight"].data_ptr()
        assert rows[2].data_ptr() == read["backbone.blocks.0.attn.wv.weight"].data_ptr()


@pytest.mark.parametrize("change", ["replaced", "rewritten"])
def test_a_file_changed_while_it_is_read_is_refused(pose_dir, tmp_path, change):
    weights = pose_dir / hub.WEIGHTS_NAME
    other = tmp_path / "other.safetensors"
    shutil.copy2(weights, other)

    def change_the_file(fraction, text):  # called while the weights are read
        if not other.exists():
            return  # changed already
        if change == "replaced":
            other.replace(weights)  # another file of the same size and time moved to its path
        else:
            with weights.open("ab") as file:
                file.write(b"\0" * 8)
            other.unlink()

    changed = r"model.safetensors: the file changed on disk while it was read"
    with pytest.raises(CheckpointError, match=changed):
        sapiens2.from_pretrained(pose_dir, device="cpu", progress=change_the_file)


def test_loading_runs_no_initializer_on_real_memory(pose_dir, monkeypatch):
    touched: list[str] = []
    for name in [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]:
        original = getattr(torch.nn.init, name)

        def recording(tensor, *args, _name=name, _original=original, **kwargs):
            if not tensor.is_meta:
                touched.append(_name)
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.nn.init, name, recording)
    with torch.device("cpu"):
        torch.nn.Linear(2, 2)  # the recorder works
    assert touched
    touched.clear()
    for dtype in (torch.float32, torch.bfloat16):
        sapiens2.from_pretrained(pose_dir, device="cpu", dtype=dtype)
    assert touched == []


def test_progress_reports_rise_to_one(pose_dir):
    reports: list[tuple[float, str]] = []
    for dtype in (torch.float32, torch.bfloat16):  # the memory-mapped and the converting paths
        reports.clear()
        sapiens2.from_pretrained(pose_dir, device="cpu", dtype=dtype, progress=lambda *r: reports.append(r))
        fractions = [f for f, _ in reports]
        assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
        assert all(str(pose_dir) in text for _, text in reports)


# ---- broken checkpoints -----------------------------------------------------------------------------------


def rewrite_weights(directory: Path, change) -> Path:
    """Save the directory's weights after `change(weights)` mutates them."""
    weights = load_file(directory / hub.WEIGHTS_NAME)
    change(weights)
    save_file(weights, directory / hub.WEIGHTS_NAME)
    return directory


def test_truncated_file_is_refused_before_use(pose_dir):
    weights = pose_dir / hub.WEIGHTS_NAME
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"model.safetensors: truncated or corrupt"):
        sapiens2.from_pretrained(pose_dir, device="cpu")


@pytest.mark.parametrize(
    "content",
    [b"", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}", (10**12).to_bytes(8, "little") + b"{}"],
)
def test_corrupt_header_is_a_checkpoint_error(pose_dir, content):
    (pose_dir / hub.WEIGHTS_NAME).write_bytes(content)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        sapiens2.from_pretrained(pose_dir, device="cpu")


def test_renamed_tensor_is_listed_as_missing_and_unexpected(pose_dir):
    def rename(weights):
        weights["backbone.blocks.0.attn.wq_renamed.weight"] = weights.pop("backbone.blocks.0.attn.wq.weight")

    rewrite_weights(pose_dir, rename)
    with pytest.raises(CheckpointError) as error:
        sapiens2.from_pretrained(pose_dir, device="cpu")
    message = str(error.value)
    assert str(pose_dir) in message
    assert "1 missing tensors: backbone.blocks.0.attn.wq.weight" in message
    assert "1 unexpected tensors: backbone.blocks.0.attn.wq_renamed.weight" in message


def test_many_missing_tensors_are_listed_briefly(pose_dir):
    rewrite_weights(pose_dir, lambda w: [w.pop(n) for n in list(w) if n.startswith("backbone.blocks.1.")])
    with pytest.raises(CheckpointError, match=r"\d+ missing tensors: .* \(and \d+ more\)"):
        sapiens2.from_pretrained(pose_dir, device="cpu")


def test_wrong_shape_is_named(pose_dir):
    rewrite_weights(pose_dir, lambda w: w.update({"decode_head.conv_pose.bias": torch.zeros(7)}))
    message = r"wrong shape: decode_head.conv_pose.bias \[7\] \(model: \[308\]\)"
    with pytest.raises(CheckpointError, match=message):
        sapiens2.from_pretrained(pose_dir, device="cpu")


def test_unknown_config_value_is_a_config_error_naming_the_checkpoint(pose_dir):
    config = json.loads((pose_dir / hub.CONFIG_NAME).read_text())
    config["hidden_act"] = "tanh"
    (pose_dir / hub.CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=rf"{pose_dir}: hidden_act"):
        sapiens2.from_pretrained(pose_dir, device="cpu")


def test_unknown_architecture_is_a_config_error(pose_dir):
    config = json.loads((pose_dir / hub.CONFIG_NAME).read_text())
    config["architectures"] = ["Sapiens2ForAlbedoEstimation"]
    (pose_dir / hub.CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="Sapiens2ForAlbedoEstimation"):
        sapiens2.from_pretrained(pose_dir, device="cpu")


@pytest.mark.parametrize("missing", [hub.CONFIG_NAME, hub.WEIGHTS_NAME])
def test_incomplete_directory_is_not_found(pose_dir, missing):
    (pose_dir / missing).unlink()
    with pytest.raises(CheckpointNotFoundError, match=rf"{pose_dir}: no {missing}"):
        sapiens2.from_pretrained(pose_dir, device="cpu")


@pytest.mark.parametrize("source", ["missing/sapiens2_0.4b_pose.safetensors", "./nowhere", "/no/such/dir/x"])
def test_missing_path_is_not_found(source, no_checkpoint_dir):
    with pytest.raises(CheckpointNotFoundError, match="no such file or directory"):
        sapiens2.from_pretrained(source, device="cpu")


def test_non_safetensors_file_is_refused(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointError, match="expected a .safetensors file"):
        sapiens2.resolve_checkpoint(path)


# ---- the Hub and its cache (never the network) ------------------------------------------------------------


@pytest.fixture
def empty_hf_home(tmp_path, monkeypatch, no_checkpoint_dir) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path / "hf"


def test_offline_with_nothing_cached_says_how_to_provide_the_files(empty_hf_home):
    with pytest.raises(CheckpointNotFoundError) as error:
        sapiens2.from_pretrained(REPO, device="cpu")
    message = str(error.value)
    assert message.startswith(f"{REPO}: config.json is not on this machine, and HF_HUB_OFFLINE=1 forbids")
    assert f"hf download {REPO} --include config.json" in message
    assert "--checkpoint-dir checkpoints (or SAPIENS2_CHECKPOINT_DIR=checkpoints)" in message
    assert not set(message) & set("<>*`[]"), "plain text: nothing that HTML or Markdown would swallow"
    assert sapiens2.checkpoint_download_size(REPO) is None


def test_offline_with_a_missing_revision_names_it(empty_hf_home):
    with pytest.raises(CheckpointNotFoundError, match=rf"{REPO}@v2: config.json is not on this machine"):
        sapiens2.from_pretrained(REPO, device="cpu", revision="v2")


def test_checkpoint_dir_without_the_repo_falls_back_to_the_hub(empty_hf_home, tmp_path, monkeypatch):
    monkeypatch.setenv(hub.CHECKPOINT_DIR_ENV, str(tmp_path / "mine"))
    with pytest.raises(CheckpointNotFoundError, match="It is not in the checkpoint folder either") as error:
        sapiens2.from_pretrained(REPO, device="cpu")
    assert str(tmp_path) not in str(error.value), "the message shows no folder of the server"


def cache_in_hf_home(hf_home: Path, source: Path, names: list[str]) -> Path:
    """Place files of `source` in the Hugging Face cache layout as REPO at its main revision."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_cache = hf_home / "hub" / ("models--" + REPO.replace("/", "--"))
    snapshot = repo_cache / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo_cache / "refs").mkdir(exist_ok=True)
    (repo_cache / "refs" / "main").write_text(commit)
    for name in names:
        shutil.copy(source / name, snapshot / name)
    return snapshot


def test_hugging_face_cache_is_used_offline(empty_hf_home, pose_dir):
    snapshot = cache_in_hf_home(empty_hf_home, pose_dir, [hub.CONFIG_NAME, hub.WEIGHTS_NAME])

    resolved = sapiens2.resolve_checkpoint(REPO)
    assert resolved.repo_id == REPO and resolved.weight_paths == (snapshot / hub.WEIGHTS_NAME,)
    model = sapiens2.from_pretrained(REPO, device="cpu")
    assert_loaded_from(model, load_file(pose_dir / hub.WEIGHTS_NAME), torch.float32)
    assert sapiens2.checkpoint_download_size(REPO) == 0


@pytest.fixture(autouse=True)
def no_remembered_sizes():
    """Each test's stand-in for the Hub answers for itself, not a size an earlier test's stand-in gave."""
    hub.forget_remote_sizes()
    yield
    hub.forget_remote_sizes()


@pytest.fixture
def reachable_hub(monkeypatch):
    """The Hub taken as reachable without asking it: the test's stand-ins answer for it."""
    monkeypatch.setattr(hub_access, "reachable", lambda: True)


def http_response(status: int) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", f"https://huggingface.co/{REPO}"))


@pytest.mark.parametrize(
    "raised, expected, message",
    [
        (GatedRepoError("", response=http_response(403)), CheckpointError, "is gated: accept its terms"),
        (RepositoryNotFoundError("", response=http_response(404)), CheckpointNotFoundError, "no Hub repo"),
        (RevisionNotFoundError("", response=http_response(404)), CheckpointNotFoundError, "no revision 'v9'"),
        (HfHubHTTPError("", response=http_response(401)), CheckpointError, r"access denied \(HTTP 401\)"),
        (HfHubHTTPError("", response=http_response(503)), CheckpointError, r"failed \(HTTP 503\)"),
        (httpx.ReadTimeout("timed out"), CheckpointError, "downloading config.json failed: timed out"),
        (LocalEntryNotFoundError("no"), CheckpointNotFoundError, "could not be downloaded"),
    ],
)
def test_hub_failures_become_one_clear_error(
    monkeypatch, no_checkpoint_dir, reachable_hub, raised, expected, message
):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def failing_download(repo_id, filename, **kwargs):
        raise raised

    monkeypatch.setattr(hub, "hf_hub_download", failing_download)
    with pytest.raises(expected, match=message) as error:
        sapiens2.from_pretrained(REPO, device="cpu", revision="v9")
    assert REPO in str(error.value)


def test_download_size_asks_the_hub_once_per_repo_and_revision(empty_hf_home, monkeypatch, reachable_hub):
    # The app's size note calls this on every change of a size menu, from anyone, outside the queue.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    asked = []

    class FakeApi:
        def model_info(self, repo_id, *, revision, files_metadata):
            asked.append((repo_id, revision))
            if revision == "broken":
                raise httpx.ConnectError("refused")
            names = {hub.CONFIG_NAME: 1_000, hub.WEIGHTS_NAME: 9_000}
            return SimpleNamespace(siblings=[SimpleNamespace(rfilename=n, size=s) for n, s in names.items()])

    monkeypatch.setattr(hub, "HfApi", FakeApi)
    assert {sapiens2.checkpoint_download_size(REPO) for _ in range(200)} == {10_000}
    assert sapiens2.checkpoint_download_size(REPO, revision="v2") == 10_000
    assert {sapiens2.checkpoint_download_size(REPO, revision="broken") for _ in range(50)} == {None}
    assert asked == [(REPO, None), (REPO, "v2"), (REPO, "broken")]
    hub.forget_remote_sizes()
    sapiens2.checkpoint_download_size(REPO)
    assert len(asked) == 4


def test_download_size_counts_only_what_is_not_cached(empty_hf_home, pose_dir, monkeypatch, reachable_hub):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    sizes = {hub.CONFIG_NAME: 2_000, hub.WEIGHTS_NAME: 5_000_000, "README.md": 10}

    class FakeApi:
        def model_info(self, repo_id, *, revision, files_metadata):
            assert (repo_id, revision, files_metadata) == (REPO, None, True)
            siblings = [SimpleNamespace(rfilename=name, size=size) for name, size in sizes.items()]
            return SimpleNamespace(siblings=siblings)

    monkeypatch.setattr(hub, "HfApi", FakeApi)
    assert sapiens2.checkpoint_download_size(REPO) == 5_002_000
    cache_in_hf_home(empty_hf_home, pose_dir, [hub.CONFIG_NAME])
    assert sapiens2.checkpoint_download_size(REPO) == 5_000_000
    cache_in_hf_home(empty_hf_home, pose_dir, [hub.WEIGHTS_NAME])
    assert sapiens2.checkpoint_download_size(REPO) == 0


def test_sharded_hub_repo_downloads_every_shard(monkeypatch, no_checkpoint_dir, pose_dir, tmp_path):
    weights = load_file(pose_dir / hub.WEIGHTS_NAME)
    names = sorted(weights)
    files = {hub.CONFIG_NAME: pose_dir / hub.CONFIG_NAME, hub.INDEX_NAME: tmp_path / hub.INDEX_NAME}
    weight_map = {}
    for index, part in enumerate((names[:10], names[10:]), start=1):
        shard = f"model-{index:05d}-of-00002.safetensors"
        save_file({n: weights[n] for n in part}, tmp_path / shard)
        files[shard] = tmp_path / shard
        weight_map.update(dict.fromkeys(part, shard))
    files[hub.INDEX_NAME].write_text(json.dumps({"weight_map": weight_map}))
    asked = []

    def fake_download(repo_id, filename, *, revision, cache_dir, local_files_only, tqdm_class):
        asked.append(filename)
        if filename not in files:
            raise RemoteEntryNotFoundError("absent", response=http_response(404))
        if tqdm_class is not None:
            bar = tqdm_class(total=200, disable=True)
            bar.update(100)
            bar.update(100)
        return str(files[filename])

    monkeypatch.setattr(hub, "hf_hub_download", fake_download)
    reports = []
    model = sapiens2.from_pretrained(REPO, device="cpu", progress=lambda f, t: reports.append((f, t)))
    assert asked == [hub.CONFIG_NAME, hub.WEIGHTS_NAME, hub.INDEX_NAME, *sorted(set(weight_map.values()))]
    assert_loaded_from(model, weights, torch.float32)
    assert (0.5, f"downloading {REPO}/config.json: 0 of 0 MB") in reports
    assert reports[-1][0] == pytest.approx(1.0)


def test_repo_without_weights_is_not_found(monkeypatch, no_checkpoint_dir, pose_dir):
    def fake_download(repo_id, filename, **kwargs):
        if filename == hub.CONFIG_NAME:
            return str(pose_dir / hub.CONFIG_NAME)
        raise RemoteEntryNotFoundError("absent", response=http_response(404))

    monkeypatch.setattr(hub, "hf_hub_download", fake_download)
    with pytest.raises(CheckpointNotFoundError, match=rf"{REPO} has no file model.safetensors"):
        sapiens2.from_pretrained(REPO, device="cpu")


def test_processor_config_dir_finds_the_file_or_answers_none(tmp_path, monkeypatch):
    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tmp_path / "mirror"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-home"))
    with_file = tmp_path / "mirror" / "facebook" / "sapiens2-normal-0.4b"
    without = tmp_path / "mirror" / "facebook" / "sapiens2-seg-0.4b"
    for folder in (with_file, without):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    (with_file / "preprocessor_config.json").write_text('{"do_pad": true}')
    assert hub.processor_config_dir("facebook/sapiens2-normal-0.4b") == with_file
    assert hub.processor_config_dir("facebook/sapiens2-seg-0.4b") is None
    assert hub.processor_config_dir(str(with_file)) == with_file
    assert hub.processor_config_dir("facebook/sapiens2-pose-0.4b") is None  # offline, nothing cached


class SilentServer:
    """A local TCP server that accepts connections and never answers: a Hub that cannot be reached."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.accepted = 0
        self.connections = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def _accept(self):
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.accepted += 1
            self.connections.append(connection)

    def close(self):
        for connection in self.connections:
            connection.close()
        self.socket.close()


def test_an_unreachable_hub_is_asked_once_and_every_file_fails_at_once(empty_hf_home, monkeypatch):
    silent = SilentServer()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", silent.url)
    hub_access.forget()
    try:
        for _ in range(3):
            with pytest.raises(CheckpointNotFoundError) as error:
                sapiens2.from_pretrained(REPO, device="cpu")
            assert "the Hugging Face Hub cannot be reached from it" in str(error.value)
            assert "HF_HUB_OFFLINE=1" in str(error.value)
        assert sapiens2.checkpoint_download_size(REPO) is None
        assert hub.processor_config_dir(REPO) is None
        assert silent.accepted == 1, "one short request told the machine has no connection"
    finally:
        hub_access.forget()
        silent.close()
