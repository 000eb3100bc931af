"""Write tests/data/upstream_loss_goldens.npz: the official recipes' loss terms on fixed random inputs.

    python tools/upstream_loss_goldens.py /path/to/facebookresearch/sapiens2 [--out tests/data/...npz]

For each task, the decode head of the official 0.4b 1024x768 config (matting: 1b, its only size) is built
with tiny widths and the config's own `loss_decode` list, and its `loss` method runs on seeded random
predictions and targets; the terms are reduced the way the official runner does (`BaseModel.parse_losses`).
The file holds the inputs, every term, and the gradient of their sum with respect to the predictions.
tests/test_losses.py compares sapiens2.models.losses against it; the tests never import the upstream code.
The matting losses and head (`sapiens/dense/src/models/{losses/matting_loss.py,heads/matting_head.py}`) came
after the repository's first commit: the checkout must hold them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

CONFIGS = {
    "pose": "sapiens/pose/configs/keypoints308/shutterstock_goliath_3po/"
    "sapiens2_0.4b_keypoints308_shutterstock_goliath_3po-1024x768.py",
    "seg": "sapiens/dense/configs/seg/shutterstock_goliath/"
    "sapiens2_0.4b_seg_shutterstock_goliath-1024x768.py",
    "normal": "sapiens/dense/configs/normal/metasim_render_people/"
    "sapiens2_0.4b_normal_metasim_render_people-1024x768.py",
    "pointmap": "sapiens/dense/configs/pointmap/render_people/"
    "sapiens2_0.4b_pointmap_render_people-1024x768.py",
    "matting": "sapiens/dense/configs/matting/gss_p3m_metasim/"
    "sapiens2_1b_matting_gss_p3m_metasim-1024x768.py",  # the one size released
}
TINY = 4  # head widths: the loss does not depend on them


def _head(root: Path, task: str, **overrides):
    """The task's official decode head with tiny layers and the config's losses."""
    from sapiens.engine.config import Config
    from sapiens.registry import MODELS

    config = Config.fromfile(str(root / CONFIGS[task])).model["decode_head"]
    head = dict(config)
    head.update(in_channels=TINY, **overrides)
    return MODELS.build(head)


def _parse(losses: dict) -> dict[str, torch.Tensor]:
    """The terms as the official runner reduces them (each to its mean; only names holding 'loss')."""
    from sapiens.engine.models.base_model import BaseModel

    _, terms = BaseModel.parse_losses(None, losses)
    return {name: value for name, value in terms.items() if "loss" in name and name != "loss"}


def _record(out: dict, task: str, inputs: dict[str, torch.Tensor], terms: dict, wrt: dict) -> None:
    """Store inputs, terms and the gradient of the terms' sum with respect to `wrt`."""
    total = sum(terms.values())
    gradients = torch.autograd.grad(total, list(wrt.values()))
    for name, value in inputs.items():
        out[f"{task}/input/{name}"] = value.detach().numpy()
    for name, value in terms.items():
        out[f"{task}/term/{name}"] = np.float64(value.detach().item())
    for name, gradient in zip(wrt, gradients, strict=True):
        out[f"{task}/grad/{name}"] = gradient.numpy()


def pose(root: Path, generator: torch.Generator, out: dict) -> None:
    head = _head(root, "pose", out_channels=5, deconv_out_channels=(TINY,), deconv_kernel_sizes=(4,),
                 conv_out_channels=(TINY,), conv_kernel_sizes=(1,))  # fmt: skip
    heatmaps = torch.rand(2, 5, 8, 6, generator=generator, requires_grad=True)
    targets = torch.rand(2, 5, 8, 6, generator=generator)
    weights = (torch.rand(2, 5, generator=generator) > 0.3).float()
    losses, _ = head.loss(heatmaps, {"heatmaps": targets, "keypoint_weights": weights[:, None]})
    terms = _parse(losses)
    _record(out, "pose", {"heatmaps": heatmaps, "targets": targets, "weights": weights}, terms,
            {"heatmaps": heatmaps})  # fmt: skip


def seg(root: Path, generator: torch.Generator, out: dict) -> None:
    head = _head(root, "seg", num_classes=29, deconv_out_channels=(TINY,), deconv_kernel_sizes=(4,),
                 conv_out_channels=(TINY,), conv_kernel_sizes=(1,))  # fmt: skip
    logits = torch.randn(3, 29, 8, 6, generator=generator, requires_grad=True)
    labels = torch.randint(0, 29, (3, 16, 12), generator=generator)
    labels[0, :4] = 255  # ignored pixels
    labels[2] = torch.where(labels[2] % 3 == 0, 255, 0)  # an image with background and ignored pixels only
    losses, _ = head.loss(logits, {"gt_seg": labels[:, None]})
    _record(out, "seg", {"logits": logits, "labels": labels}, _parse(losses), {"logits": logits})


def normal(root: Path, generator: torch.Generator, out: dict) -> None:
    head = _head(root, "normal", upsample_channels=[TINY], conv_out_channels=[TINY], conv_kernel_sizes=[3])
    normals = torch.randn(2, 3, 12, 10, generator=generator, requires_grad=True)
    mask = torch.rand(2, 1, 12, 10, generator=generator) > 0.3
    targets = torch.nn.functional.normalize(torch.randn(2, 3, 12, 10, generator=generator), dim=1)
    targets = torch.where(mask, targets, -1000.0)  # the official background value
    losses, _ = head.loss(normals, {"gt_normal": targets, "mask": mask})
    _record(out, "normal", {"normals": normals, "targets": targets, "mask": mask.float()}, _parse(losses),
            {"normals": normals})  # fmt: skip


def pointmap(root: Path, generator: torch.Generator, out: dict) -> None:
    head = _head(root, "pointmap", upsample_channels=[TINY], conv_out_channels=[TINY], conv_kernel_sizes=[3],
                 scale_conv_out_channels=None)  # fmt: skip
    batch, height, width = 2, 16, 12
    # Targets as the official pipeline makes them: a pinhole camera's points from depth, scaled to the
    # canonical focal length; invalid points set to 0.
    fx = torch.tensor([300.0, 520.0])
    intrinsics = torch.zeros(batch, 3, 3)
    intrinsics[:, 0, 0], intrinsics[:, 1, 1] = fx, fx * 1.05
    intrinsics[:, 0, 2], intrinsics[:, 1, 2], intrinsics[:, 2, 2] = width / 2 - 0.3, height / 2 + 0.2, 1
    depth = 2 + torch.rand(batch, height, width, generator=generator)
    columns, rows = torch.arange(width).float(), torch.arange(height).float()[:, None]
    k = intrinsics.view(batch, 9, 1, 1)
    x = (columns - k[:, 2]) * depth / k[:, 0]
    y = (rows - k[:, 5]) * depth / k[:, 4]
    scale = 768.0 / fx
    mask = torch.rand(batch, 1, height, width, generator=generator) > 0.2
    targets = torch.stack([x, y, depth], dim=1) * scale.view(-1, 1, 1, 1) * mask
    mean_depth = torch.stack([targets[i, 2][mask[i, 0]].mean() for i in range(batch)]).view(-1, 1, 1, 1)
    pointmaps = (targets + 0.3 * torch.randn(targets.shape, generator=generator)).requires_grad_()
    scales = (scale.view(-1, 1) + 0.1 * torch.randn(batch, 1, generator=generator)).requires_grad_()
    samples = {
        "gt_pointmap": targets,
        "gt_mean_depth": mean_depth,
        "mask": mask,
        "meta": {"original_K": intrinsics, "scale": scale},
    }
    losses, _ = head.loss((pointmaps, scales), samples)
    inputs = {"pointmaps": pointmaps, "scales": scales, "targets": targets, "mask": mask.float(),
              "intrinsics": intrinsics, "target_scales": scale.view(-1, 1)}  # fmt: skip
    _record(out, "pointmap", inputs, _parse(losses), {"pointmaps": pointmaps, "scales": scales})


def matting(root: Path, generator: torch.Generator, out: dict) -> None:
    """One batch as the official combined datasets mix them: the first photo with its foreground labels
    (every pixel counts), the second without, where `MattingPackInputs` takes the photo's colours at opaque
    pixels and trains the foreground only where alpha is 0 or at least 254/255."""
    head = _head(root, "matting", upsample_channels=[TINY], conv_out_channels=[TINY], conv_kernel_sizes=[3])
    batch, height, width = 2, 34, 32  # an odd half (17) on the way down the Laplacian pyramid
    alphas = torch.rand(batch, 1, height, width, generator=generator)
    alphas[:, :, :10] = 0.0
    alphas[:, :, 24:] = 1.0
    photos = torch.rand(batch, 3, height, width, generator=generator)
    opaque = alphas >= 0.996
    foregrounds = torch.cat([photos[:1] * alphas[:1], photos[1:] * opaque[1:]])
    mask = torch.cat([torch.ones_like(opaque[:1]), opaque[1:] | (alphas[1:] == 0.0)])
    outputs = torch.rand(batch, 4, height, width, generator=generator).requires_grad_()
    losses, _ = head.loss(outputs, {"gt_alpha": alphas, "gt_foreground": foregrounds, "mask": mask})
    inputs = {"outputs": outputs, "labels": torch.cat([foregrounds, alphas], dim=1), "mask": mask.float()}
    _record(out, "matting", inputs, _parse(losses), {"outputs": outputs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("upstream", type=Path, help="a checkout of facebookresearch/sapiens2")
    default = Path(__file__).resolve().parents[1] / "tests" / "data" / "upstream_loss_goldens.npz"
    parser.add_argument("--out", type=Path, default=default)
    args = parser.parse_args()
    sys.path.insert(0, str(args.upstream.resolve()))
    import sapiens.dense.src.models  # noqa: F401  (registers the dense heads and losses)
    import sapiens.pose.src.models  # noqa: F401

    out: dict[str, np.ndarray] = {}
    for seed, make in enumerate((pose, seg, normal, pointmap, matting)):
        make(args.upstream, torch.Generator().manual_seed(seed), out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **out)
    terms = {key: float(value) for key, value in out.items() if "/term/" in key}
    print(f"{args.out}: {args.out.stat().st_size} bytes, {len(out)} arrays")
    for key, value in terms.items():
        print(f"  {key} = {value:.6g}")


if __name__ == "__main__":
    main()
