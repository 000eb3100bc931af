"""Models and post-processing against Meta's own code, through the golden files of tools/upstream_goldens.py.

Upstream is never imported here: the files in tests/data hold its inputs, weights and outputs (see
docs/fidelity.md for how they were made and the differences measured).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import sapiens2
from sapiens2.errors import ConfigError
from sapiens2.models import presets
from sapiens2.models.config import HeadConfig, Sapiens2Config
from sapiens2.models.heads import DecodeHead, PointmapHead
from sapiens2.models.modeling import build_model
from sapiens2.vision.dense import pointmap_to_image
from sapiens2.vision.processing import ProcessorSettings, content_box

DATA = Path(__file__).parent / "data"
TOLERANCE = 1e-5  # relative (Frobenius) error; measured values are in docs/fidelity.md


def golden(name: str) -> dict[str, np.ndarray]:
    with np.load(DATA / name, allow_pickle=False) as file:
        return {key: file[key] for key in file.files}


def state(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, torch.Tensor]:
    """The state_dict stored under `prefix`/state/."""
    start = f"{prefix}/state/"
    return {
        key[len(start) :]: torch.from_numpy(value) for key, value in arrays.items() if key.startswith(start)
    }


def relative_error(ours: torch.Tensor, reference: np.ndarray) -> float:
    expected = torch.from_numpy(reference)
    assert ours.shape == expected.shape
    return float((ours - expected).norm() / expected.norm())


# ---- backbone, with and without the 4K tokenizer ---------------------------------------------------------


def backbone_config(meta: dict) -> dict:
    """Our config.json for the upstream backbone built from `meta` (its construction arguments)."""
    arch = meta["arch_settings"]
    config = {
        "architectures": ["Sapiens2Model"],
        "hidden_size": arch["embed_dims"],
        "num_hidden_layers": arch["num_layers"],
        "num_attention_heads": arch["num_heads"],
        # Upstream's blocks use full attention for the first and last 8 blocks, so all of a 3-block model.
        "num_key_value_heads_per_layer": [arch["num_heads"]] * arch["num_layers"],
        "intermediate_size": arch["feedforward_channels"],
        "patch_size": meta["patch_size"],
        "image_size": list(meta["img_size"]),
        "num_register_tokens": meta["n_storage_tokens"],
    }
    if meta["use_tokenizer"]:
        config.update(
            use_tokenizer=True,
            window_size=meta["window_size"],
            num_tokenizer_layers=meta["num_tokenizer_layers"],
        )
    return config


@pytest.mark.parametrize("name", ["upstream_backbone.npz", "upstream_backbone_4k.npz"])
def test_backbone_matches_upstream(name, tmp_path):
    arrays = golden(name)
    meta = json.loads(str(arrays["meta"]))
    (tmp_path / "config.json").write_text(json.dumps(backbone_config(meta)))
    # Upstream's state_dict as it saved it (RoPE periods included), loaded with one strict load_state_dict.
    save_file(state(arrays, "model"), tmp_path / "model.safetensors")
    model = sapiens2.from_pretrained(tmp_path, device="cpu", dtype=torch.float32)
    with torch.inference_mode():
        tokens = model(torch.from_numpy(arrays["input"])).last_hidden_state
    assert relative_error(tokens, arrays["output"]) < TOLERANCE


def test_backbone_uses_the_rope_periods_its_checkpoint_stores(tmp_path):
    """Upstream's backbone as the official checkpoints were built (RoPE in bf16, so bf16 periods in its
    state_dict), saved with those periods: our tokens are upstream's fp32 RoPE path with the same periods,
    and a file without them gives the tokens of periods computed in fp32."""
    arrays = golden("upstream_backbone_trained_periods.npz")
    assert str(arrays["periods_dtype"]) == "torch.bfloat16"
    meta = json.loads(str(arrays["meta"]))
    weights = state(arrays, "model")
    weights["rope_embed.periods"] = weights["rope_embed.periods"].to(torch.bfloat16)  # exact: bf16 values
    for name, file_weights in {
        "output": weights,
        "recomputed": {k: v for k, v in weights.items() if k != "rope_embed.periods"},
    }.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(backbone_config(meta)))
        save_file(file_weights, folder / "model.safetensors")
        model = sapiens2.from_pretrained(folder, device="cpu", dtype=torch.float32)
        with torch.inference_mode():
            tokens = model(torch.from_numpy(arrays["input"])).last_hidden_state
        assert relative_error(tokens, arrays[name]) < TOLERANCE, name
    assert relative_error(torch.from_numpy(arrays["recomputed"]), arrays["output"]) > 1e-4


def test_4k_tokenizer_output_depends_on_its_weights():
    """The 4K golden exercises the tokenizer: zeroing its summary token changes every output token."""
    arrays = golden("upstream_backbone_4k.npz")
    config = Sapiens2Config.from_dict(backbone_config(json.loads(str(arrays["meta"]))))
    model = build_model(config)
    model.load_state_dict(state(arrays, "model"), strict=True)
    model.tokenizer.w_cls.data.zero_()
    with torch.inference_mode():
        tokens = model(torch.from_numpy(arrays["input"])).last_hidden_state
    assert relative_error(tokens, arrays["output"]) > 0.05


def test_4k_preset_has_upstream_tensor_names_and_shapes():
    arrays = golden("upstream_backbone_4k.npz")
    expected = dict(
        zip(arrays["real_1b_4k/names"].tolist(), arrays["real_1b_4k/shapes"].tolist(), strict=True)
    )
    with torch.device("meta"):
        model = build_model(Sapiens2Config.from_dict(presets.preset_config("1b-4k", "pretrain")))
    ours = {name: "x".join(map(str, t.shape)) for name, t in model.state_dict().items()}
    assert ours == expected
    assert model.config.image_size == (4096, 3072)


# ---- decode heads -----------------------------------------------------------------------------------------


def head_config(args: dict) -> tuple[HeadConfig, int, str]:
    """Our head config, output channels and predictor name for upstream's head arguments."""
    kind = args["type"]
    if kind in ("PoseHeatmapHead", "SegHead"):
        fields = {
            "upsample_out_channels": list(args["deconv_out_channels"]),
            "upsample_kernel_sizes": list(args["deconv_kernel_sizes"]),
            "conv_out_channels": list(args["conv_out_channels"]),
            "conv_kernel_sizes": list(args["conv_kernel_sizes"]),
        }
        if kind == "PoseHeatmapHead":
            return HeadConfig(**fields), args["out_channels"], "conv_pose"
        return HeadConfig(**fields), args["num_classes"], "conv_seg"
    fields = {
        "use_pixel_shuffle": True,
        "upsample_out_channels": args["upsample_channels"],
        "upsample_kernel_sizes": [3] * len(args["upsample_channels"]),  # fixed at 3 upstream
        "conv_out_channels": args["conv_out_channels"],
        "conv_kernel_sizes": args["conv_kernel_sizes"],
    }
    if kind == "PointmapHead":
        final = args["scale_final_layer"]
        fields.update(
            scale_conv_out_channels=list(args["scale_conv_out_channels"]),
            scale_conv_kernel_sizes=list(args["scale_conv_kernel_sizes"]),
            scale_final_input_size=final[0],
            scale_final_hidden_sizes=list(final[1:3]),
        )
        return HeadConfig(**fields), 3, "conv_pointmap"
    return HeadConfig(**fields), 3, "conv_normal"


HEADS = ["pose_k2", "pose_k3", "pose_k4", "seg_k3_k2", "normal", "pointmap"]


@pytest.mark.parametrize("name", HEADS)
def test_head_matches_upstream(name):
    arrays = golden("upstream_heads.npz")
    args = json.loads(str(arrays[f"{name}/meta"]))
    config, outputs, predictor = head_config(args)
    channels = args["in_channels"]
    if predictor == "conv_pointmap":
        head = PointmapHead(channels, outputs, config, "silu")
    else:
        head = DecodeHead(channels, outputs, config, predictor)
    head.load_state_dict(state(arrays, name), strict=True)
    with torch.inference_mode():
        result = head.eval()(torch.from_numpy(arrays[f"{name}/input"]))
    results = result if isinstance(result, tuple) else (result,)
    for index, value in enumerate(results):
        assert relative_error(value, arrays[f"{name}/output{index}"]) < TOLERANCE


def test_every_deconv_kernel_doubles_the_size_like_upstream():
    arrays = golden("upstream_heads.npz")
    for name in ("pose_k2", "pose_k3", "pose_k4", "seg_k3_k2"):
        height, width = arrays[f"{name}/input"].shape[-2:]
        assert arrays[f"{name}/output0"].shape[-2:] == (4 * height, 4 * width)


@pytest.mark.parametrize("kernels", [[5, 4], [1], [4, 6]])
def test_deconv_kernels_upstream_refuses_are_config_errors(kernels):
    head = {
        "upsample_out_channels": [8] * len(kernels),
        "upsample_kernel_sizes": kernels,
        "conv_out_channels": [],
    }
    with pytest.raises(ConfigError, match=r"upsample_kernel_sizes: .*kernels of 2, 3, 4 only"):
        HeadConfig.from_dict(head, (64, 48), (16, 16))


def test_pixel_shuffle_heads_take_any_kernel_size():
    head = {"use_pixel_shuffle": True, "upsample_out_channels": [8], "upsample_kernel_sizes": [5]}
    assert HeadConfig.from_dict(head, (64, 48), (16, 16)).upsample_kernel_sizes == [5]


# ---- the pointmap demo's smoothing ------------------------------------------------------------------------


SMOOTHING = golden("upstream_pointmap_smoothing.npz")
PHOTO_SIZES = [
    tuple(int(v) for v in key.split("/")[0].split("x")) for key in SMOOTHING if key.endswith("/output")
]


def demo_settings() -> ProcessorSettings:
    height, width = (int(v) for v in SMOOTHING["model_size"])
    return ProcessorSettings(height=height, width=width, do_pad=True)


@pytest.mark.parametrize("photo", PHOTO_SIZES, ids=lambda size: f"{size[0]}x{size[1]}")
def test_smoothed_pointmap_matches_the_demo(photo):
    pointmap, scale = torch.from_numpy(SMOOTHING["pointmap"]), torch.from_numpy(SMOOTHING["scale"])
    settings = demo_settings()
    expected = SMOOTHING[f"{photo[0]}x{photo[1]}/output"]
    top, left, bottom, right = content_box(photo, settings)
    assert [left, top, settings.width - right, settings.height - bottom] == list(
        SMOOTHING[f"{photo[0]}x{photo[1]}/padding_ltrb"]
    )
    smoothed = pointmap_to_image(pointmap, scale, photo, settings, photo, smooth=True)
    assert relative_error(smoothed, expected) < TOLERANCE
    plain = pointmap_to_image(pointmap, scale, photo, settings, photo)
    enlarged = photo[0] > bottom - top or photo[1] > right - left
    # Smoothing matters where the map is enlarged (metres at the silhouette), and only there.
    assert (float((plain - smoothed).abs().max()) > 0.5) == enlarged
