"""Golden values from Meta's reference code (facebookresearch/sapiens2) for tests that never import it.

    python tools/upstream_goldens.py /path/to/sapiens2-checkout [--out tests/data]

The checkout is put on `sys.path` and imported as it is (it needs torch, torchvision, opencv, scipy and
matplotlib; its pointmap demo's optional `open3d` import is satisfied by an empty stand-in module, as only its
resizing function is called). Every module is built on fixed seeds, on the CPU, in float32, with the RoPE
tables in float32 (`pos_embed_rope_dtype="fp32"`; upstream's default computes them in bf16). Written files:

- upstream_backbone.npz: a tiny Sapiens2 backbone (width 32, 3 blocks, patch 4) without the 4K tokenizer,
  with the construction arguments, the state_dict, an input batch and the final-normalized tokens;
- upstream_backbone_4k.npz: the same with `use_tokenizer=True` (2 tokenizer blocks, 4x4 windows), run in
  chunks of 5 windows, plus the name and shape of every tensor of the real 1b 4K backbone (`sapiens2_1b`,
  `use_tokenizer=True`, built on the meta device);
- upstream_backbone_trained_periods.npz: a backbone of the official head width (64 channels) built with
  upstream's default bf16 RoPE, as the official checkpoints were, so that its state_dict holds bf16 periods;
  its tokens from the fp32 RoPE path with those periods loaded, with recomputed periods and as shipped;
- upstream_heads.npz: pose (transposed-conv kernels 2, 3 and 4, refinement convs of 3 and 1), segmentation
  (kernels 3 and 2 mixed), normal and pointmap (with its scale branch) heads at tiny widths: arguments,
  state_dicts, input features and outputs;
- upstream_pointmap_smoothing.npz: a synthetic 64x48 pointmap and scale taken through the pointmap demo's
  steps (scale division, unpadding by `PointmapResizePadImage`'s padding, `resize_pointmap(smooth=True)`)
  to four photo sizes, two enlarged (smoothed) and two not.

Each file stays well under 1 MB. Regenerate them all after changing this script (see docs/fidelity.md); the
tests in tests/test_upstream_parity.py read them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data"

TINY_ARCH = {"embed_dims": 32, "num_layers": 3, "num_heads": 4, "feedforward_channels": 64}
BACKBONE_ARGS = {"arch": "tiny", "patch_size": 4, "n_storage_tokens": 8, "pos_embed_rope_dtype": "fp32"}
TOKENIZER_LAYERS = 2
WIDE_HEAD_ARCH = {"embed_dims": 64, "num_layers": 2, "num_heads": 1, "feedforward_channels": 128}
PHOTO_SIZES = ((90, 50), (64, 100), (30, 40), (64, 48))
MODEL_SIZE = (64, 48)


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Weights drawn with a fixed seed: matrices ~ N(0, 1 / fan_in), every vector moved by N(0, 0.2)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, parameter in sorted(module.named_parameters()):
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.ndim >= 2 and parameter.shape[0] > 1 and parameter[0].numel() > 1:
                parameter.copy_(noise / parameter[0].numel() ** 0.5)
            else:
                parameter.add_(0.2 * noise)


def state_arrays(prefix: str, module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {f"{prefix}/state/{name}": t.detach().numpy().copy() for name, t in module.state_dict().items()}


def backbone_goldens(out: Path) -> None:
    from sapiens.backbones.sapiens2 import Sapiens2

    Sapiens2.arch_zoo["tiny"] = {**TINY_ARCH, "num_tokenizer_layers": TOKENIZER_LAYERS}
    cases = {
        "upstream_backbone.npz": {"use_tokenizer": False, "img_size": (16, 12)},
        "upstream_backbone_4k.npz": {"use_tokenizer": True, "img_size": (64, 48), "window_size": 4},
    }
    for seed, (name, extra) in enumerate(cases.items()):
        args = {**BACKBONE_ARGS, **extra, "out_type": "raw"}
        torch.manual_seed(seed)
        model = Sapiens2(**args).eval()
        randomize(model, seed)
        if model.tokenizer is not None:
            model.tokenizer.chunk_size = 5  # several chunks of windows, as at 4096x3072
        pixels = torch.randn((2, 3, *args["img_size"]), generator=torch.Generator().manual_seed(100 + seed))
        with torch.no_grad():
            (tokens,) = model(pixels)
        meta = {"arch_settings": TINY_ARCH, "num_tokenizer_layers": TOKENIZER_LAYERS, **args}
        arrays = {
            "meta": np.array(json.dumps(meta)),
            "input": pixels.numpy(),
            "output": tokens.numpy(),
            **state_arrays("model", model),
        }
        if extra["use_tokenizer"]:
            with torch.device("meta"):
                real = Sapiens2(arch="sapiens2_1b", img_size=(4096, 3072), use_tokenizer=True)
            state = real.state_dict()
            arrays["real_1b_4k/names"] = np.array(list(state))
            arrays["real_1b_4k/shapes"] = np.array(["x".join(map(str, t.shape)) for t in state.values()])
        np.savez_compressed(out / name, **arrays)


def trained_periods_golden(out: Path) -> None:
    """A backbone with the official head width (64 channels, so 16 RoPE periods) built as the official
    checkpoints were, RoPE in bf16, so that its state_dict stores bf16 periods; run in float32 by upstream's
    fp32 RoPE path with those periods loaded (`output`), with periods it recomputes in fp32 (`recomputed`),
    and as shipped, RoPE tables in bf16 (`as_shipped`)."""
    from sapiens.backbones.sapiens2 import Sapiens2

    Sapiens2.arch_zoo["tiny_64"] = {**WIDE_HEAD_ARCH, "num_tokenizer_layers": 0}
    args = {**BACKBONE_ARGS, "arch": "tiny_64", "img_size": (32, 24), "use_tokenizer": False}
    args["out_type"] = "raw"
    torch.manual_seed(3)
    trained = Sapiens2(**{**args, "pos_embed_rope_dtype": "bf16"}).eval()
    randomize(trained, 3)
    state = trained.state_dict()
    pixels = torch.randn((2, 3, *args["img_size"]), generator=torch.Generator().manual_seed(103))
    outputs = {}
    with torch.no_grad():
        (outputs["as_shipped"],) = trained(pixels)
        model = Sapiens2(**args).eval()
        model.load_state_dict({k: v for k, v in state.items() if not k.endswith("periods")}, strict=False)
        (outputs["recomputed"],) = model(pixels)  # its own periods, computed in fp32
        model.load_state_dict(state, strict=True)  # the bf16 periods, copied into its fp32 buffer
        (outputs["output"],) = model(pixels)
    meta = {"arch_settings": WIDE_HEAD_ARCH, "num_tokenizer_layers": 0, **args}
    # The stored periods as float32 numbers (numpy has no bf16), each exactly a bf16 value.
    arrays = {
        "meta": np.array(json.dumps(meta)),
        "input": pixels.numpy(),
        "periods_dtype": np.array(str(state["rope_embed.periods"].dtype)),
        **{name: tokens.numpy() for name, tokens in outputs.items()},
        **{f"model/state/{name}": t.float().numpy() for name, t in state.items()},
    }
    np.savez_compressed(out / "upstream_backbone_trained_periods.npz", **arrays)


def head_goldens(out: Path) -> None:
    import sapiens.dense.src.models  # noqa: F401  (registers the dense heads and losses)
    import sapiens.pose.src.models  # noqa: F401  (registers the pose head and losses)
    from sapiens.registry import MODELS

    pose_loss = {"type": "KeypointMSELoss", "use_target_weight": True}
    common = {"deconv_out_channels": (8, 8), "conv_out_channels": (8, 8), "conv_kernel_sizes": (3, 1)}
    heads = {
        **{
            f"pose_k{k}": {
                "type": "PoseHeatmapHead",
                "in_channels": 16,
                "out_channels": 5,
                "deconv_kernel_sizes": (k, k),
                "loss_decode": pose_loss,
                **common,
            }
            for k in (2, 3, 4)
        },
        "seg_k3_k2": {
            "type": "SegHead",
            "in_channels": 16,
            "num_classes": 4,
            "deconv_out_channels": (8, 8),
            "deconv_kernel_sizes": (3, 2),
            "conv_out_channels": (8,),
            "conv_kernel_sizes": (3,),
            "loss_decode": {"type": "CrossEntropyLoss"},  # the head's default names an argument it lacks
        },
        "normal": {
            "type": "NormalHead",
            "in_channels": 16,
            "upsample_channels": [8, 8],
            "conv_out_channels": [8, 4],
            "conv_kernel_sizes": [3, 1],
        },
        "pointmap": {
            "type": "PointmapHead",
            "in_channels": 16,
            "upsample_channels": [8, 8],
            "conv_out_channels": [8],
            "conv_kernel_sizes": [3],
            "scale_conv_out_channels": (8, 4),
            "scale_conv_kernel_sizes": (3, 1),
            "scale_final_layer": (16, 8, 4, 1),  # 8x6 features -> 4x3 -> 2x2, times 4 channels
        },
    }
    arrays = {}
    for seed, (name, args) in enumerate(heads.items()):
        torch.manual_seed(seed)
        head = MODELS.build(args).eval()
        randomize(head, seed)
        features = torch.randn(2, 16, 8, 6, generator=torch.Generator().manual_seed(200 + seed))
        with torch.no_grad():
            output = head(features)
        outputs = output if isinstance(output, tuple) else (output,)
        arrays[f"{name}/meta"] = np.array(json.dumps(args))
        arrays[f"{name}/input"] = features.numpy()
        for index, value in enumerate(outputs):
            arrays[f"{name}/output{index}"] = value.numpy()
        arrays.update(state_arrays(name, head))
    np.savez_compressed(out / "upstream_heads.npz", **arrays)


def _pointmap_demo(checkout: Path) -> types.ModuleType:
    """Upstream's pointmap demo script as a module (open3d replaced by an empty module: not called here)."""
    sys.modules.setdefault("open3d", types.ModuleType("open3d"))
    path = checkout / "sapiens" / "dense" / "tools" / "vis" / "vis_pointmap.py"
    spec = importlib.util.spec_from_file_location("upstream_vis_pointmap", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def synthetic_pointmap(size: tuple[int, int], seed: int) -> torch.Tensor:
    """(1, 3, H, W) points of an elliptic person 2 m away in front of a wall at 6 m, with noise."""
    generator = torch.Generator().manual_seed(seed)
    height, width = size
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
    person = (xs / 0.45) ** 2 + (ys / 0.8) ** 2 < 1
    depth = torch.where(person, 2.0 + 0.1 * ys, torch.full_like(ys, 6.0))
    depth = depth + 0.05 * torch.randn(size, generator=generator)
    return torch.stack([xs * depth * 0.6, ys * depth * 0.8, depth])[None]


def smoothing_goldens(checkout: Path, out: Path) -> None:
    from sapiens.dense.src.datasets.transforms.pointmap_transforms import PointmapResizePadImage

    demo = _pointmap_demo(checkout)
    pad = PointmapResizePadImage(height=MODEL_SIZE[0], width=MODEL_SIZE[1], pad_val=0)
    pointmap = synthetic_pointmap(MODEL_SIZE, seed=3)
    scale = torch.tensor([[1.25]])
    arrays = {"pointmap": pointmap.numpy(), "scale": scale.numpy(), "model_size": np.array(MODEL_SIZE)}
    for height, width in PHOTO_SIZES:
        results = pad.transform({"img": np.zeros((height, width, 3), dtype=np.uint8)})
        left, right, top, bottom = results["padding_size"]
        metric = pointmap / scale  # the demo's order: scale first, then unpad, then resize
        cropped = metric[:, :, top : MODEL_SIZE[0] - bottom, left : MODEL_SIZE[1] - right]
        with torch.no_grad():
            smoothed = demo.resize_pointmap(cropped, height, width, smooth=True)
        key = f"{height}x{width}"
        arrays[f"{key}/padding_ltrb"] = np.array([left, top, right, bottom])
        arrays[f"{key}/output"] = smoothed.numpy()
    np.savez_compressed(out / "upstream_pointmap_smoothing.npz", **arrays)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a facebookresearch/sapiens2 checkout (its root folder)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: tests/data)")
    args = parser.parse_args(argv)
    checkout = args.checkout.resolve()
    if not (checkout / "sapiens" / "backbones" / "sapiens2.py").is_file():
        parser.error(f"{checkout} does not look like a sapiens2 checkout (no sapiens/backbones/sapiens2.py)")
    sys.path.insert(0, str(checkout))
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # the same reductions on every machine
    backbone_goldens(args.out)
    trained_periods_golden(args.out)
    head_goldens(args.out)
    smoothing_goldens(checkout, args.out)
    for path in sorted(args.out.glob("upstream_*.npz")):
        print(f"{path}: {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
