"""Losses: the recipes against the official heads (golden file), the reference's against transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sapiens2.models import losses

GOLDENS = Path(__file__).parent / "data" / "upstream_loss_goldens.npz"
TOLERANCE = 1e-5
# Our term names for the official ones.
NAMES = {
    "pose": {"loss_kpt": "keypoint_mse"},
    "seg": {"loss_ce": "cross_entropy", "loss_dice": "dice"},
    "normal": {"loss_cosine_sim": "cosine", "loss_l1": "l1", "loss_grad_l1": "gradient"},
    "pointmap": {
        "loss_l1": "l1",
        "loss_multiscale_l1_2": "multiscale_l1",
        "loss_silog": "silog",
        "loss_K_consistency": "intrinsics",
        "loss_shift_invariant": "shift_invariant",
        "loss_normal": "normals",
        "loss_scale_l1": "scale",
    },
    "matting": {
        f"loss_{official}_{part}": f"{ours}_{target}"
        for official, ours in (("l1", "l1"), ("grad", "gradient"), ("lap", "laplacian"))
        for part, target in (("pha", "alpha"), ("fgr", "foreground"))
    },
}


@pytest.fixture(scope="module")
def goldens() -> dict[str, np.ndarray]:
    with np.load(GOLDENS) as data:
        return dict(data)


def _inputs(goldens, task: str, wrt: tuple[str, ...]) -> dict[str, torch.Tensor]:
    prefix = f"{task}/input/"
    inputs = {key[len(prefix) :]: torch.from_numpy(v) for key, v in goldens.items() if key.startswith(prefix)}
    for name in wrt:
        inputs[name].requires_grad_()
    return inputs


def _recipe(task: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if task == "pose":
        return losses.pose_recipe(inputs["heatmaps"], inputs["targets"], inputs["weights"])
    if task == "seg":
        weights = torch.tensor(losses.BODY_PART_CLASS_WEIGHTS, dtype=torch.float32)
        return losses.segmentation_recipe(inputs["logits"], inputs["labels"], weights)
    if task == "normal":
        return losses.normal_recipe(inputs["normals"], inputs["targets"], inputs["mask"])
    if task == "matting":
        outputs = inputs["outputs"]
        return losses.matting_recipe(outputs[:, 3:], outputs[:, :3], inputs["labels"], inputs["mask"])
    names = ("pointmaps", "scales", "targets", "mask", "intrinsics", "target_scales")
    return losses.pointmap_recipe(*(inputs[name] for name in names))


WRT = {
    "pose": ("heatmaps",),
    "seg": ("logits",),
    "normal": ("normals",),
    "pointmap": ("pointmaps", "scales"),
    "matting": ("outputs",),
}


@pytest.mark.parametrize("task", list(WRT))
def test_recipe_terms_and_gradients_match_official_heads(goldens, task):
    inputs = _inputs(goldens, task, WRT[task])
    terms = _recipe(task, inputs)
    assert set(terms) == set(NAMES[task].values())
    for official, ours in NAMES[task].items():
        expected = float(goldens[f"{task}/term/{official}"])
        assert abs(terms[ours].item() - expected) <= TOLERANCE * max(abs(expected), 1e-3), ours
    gradients = torch.autograd.grad(sum(terms.values()), [inputs[name] for name in WRT[task]])
    for name, gradient in zip(WRT[task], gradients, strict=True):
        expected = torch.from_numpy(goldens[f"{task}/grad/{name}"])
        assert float((gradient - expected).norm() / expected.norm()) <= TOLERANCE, name


def test_the_matting_foreground_mask_is_the_official_one_without_foreground_labels(goldens):
    # The golden's second photo has no foreground labels: the official pipeline trains where alpha is 0 or
    # opaque.
    labels, mask = (torch.from_numpy(goldens[f"matting/input/{name}"]) for name in ("labels", "mask"))
    assert torch.equal(losses.foreground_mask(labels[1:, 3:]), mask[1:])
    assert 0 < float(mask[1].mean()) < 1


def test_fitted_intrinsics_recover_the_camera(goldens):
    inputs = _inputs(goldens, "pointmap", ())
    fitted = losses.fit_intrinsics(inputs["targets"], inputs["mask"])
    assert torch.allclose(fitted, inputs["intrinsics"], rtol=1e-4, atol=1e-3)


# ---- the models' `labels=` against transformers -----------------------------------------------------------

INPUT = (2, 3, 64, 48)


def _reference_gradients(reference: torch.nn.Module, directory: Path) -> dict[str, torch.Tensor]:
    """The reference's parameter gradients under the checkpoint's tensor names (transformers renames and
    stacks its parameters when saving)."""
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.copy_(parameter.grad)
    reference.save_pretrained(directory)
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


def _assert_same_loss_and_gradients(ours, reference, our_loss, reference_loss, tmp_path):
    assert abs(our_loss.item() - reference_loss.item()) <= TOLERANCE * abs(reference_loss.item())
    our_loss.backward()
    reference_loss.backward()
    expected = _reference_gradients(reference, tmp_path / "gradients")
    ours = dict(ours.named_parameters())
    assert set(ours) == set(expected)
    largest = max(float(gradient.norm()) for gradient in expected.values())
    for name, parameter in ours.items():
        difference = float((parameter.grad - expected[name]).norm())
        if _before_instance_norm(name):
            # InstanceNorm removes a constant per channel: these biases' true gradient is 0, and both
            # implementations give float noise.
            assert max(float(parameter.grad.norm()), float(expected[name].norm())) <= 1e-6 * largest, name
        else:
            assert difference <= TOLERANCE * float(expected[name].norm()), name


def _before_instance_norm(name: str) -> bool:
    """Biases of the decode-head convs that InstanceNorm follows (all but the final 1x1 predictor)."""
    stage = name.split(".")[1]
    return (
        name.startswith("decode_head.") and name.endswith(".bias") and stage in ("conv_layers", "input_conv")
    )


def _pair(task: str, tmp_path: Path, **config):
    import transformers
    from tiny_models import tiny_config, write_transformers_checkpoint

    from sapiens2 import from_pretrained

    settings = tiny_config(task, **config)
    directory = write_transformers_checkpoint(tmp_path / "model", settings)
    reference = getattr(transformers, settings["architectures"][0]).from_pretrained(directory).train()
    ours = from_pretrained(directory, device="cpu", dtype=torch.float32).train()
    return ours, reference


def test_pose_loss_and_gradients_match_reference(tmp_path):
    ours, reference = _pair("pose", tmp_path, num_labels=17)
    generator = torch.Generator().manual_seed(0)
    pixel_values = torch.randn(INPUT, generator=generator)
    labels = torch.rand(2, 17, 16, 12, generator=generator)
    weights = (torch.rand(2, 17, 1, 1, generator=generator) > 0.3).float().expand_as(labels)
    # Training mode draws the same random RoPE rescale from torch's generator in both.
    torch.manual_seed(3)
    our_loss = ours(pixel_values, labels=labels, label_weights=weights).loss
    torch.manual_seed(3)
    reference_loss = reference(pixel_values, labels=labels, label_weights=weights).loss
    _assert_same_loss_and_gradients(ours, reference, our_loss, reference_loss, tmp_path)


def test_pose_loss_broadcasts_keypoint_weights():
    heatmaps, labels = torch.rand(2, 5, 8, 6), torch.rand(2, 5, 8, 6)
    weights = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5]).view(1, 5, 1, 1).expand(2, 5, 1, 1)
    full = losses.pose_loss(heatmaps, labels, weights.expand_as(labels).contiguous())
    assert torch.equal(losses.pose_loss(heatmaps, labels, weights), full)
    assert torch.equal(losses.pose_loss(heatmaps, labels), torch.nn.functional.mse_loss(heatmaps, labels))


def test_segmentation_loss_and_gradients_match_reference(tmp_path):
    ours, reference = _pair("seg", tmp_path, num_labels=7)
    generator = torch.Generator().manual_seed(0)
    pixel_values = torch.randn(INPUT, generator=generator)
    labels = torch.randint(0, 7, (2, 80, 60), generator=generator)  # not the logits' size: upsampled
    labels[:, :10] = 255
    torch.manual_seed(4)
    our_loss = ours(pixel_values, labels=labels).loss
    torch.manual_seed(4)
    reference_loss = reference(pixel_values, labels=labels).loss
    _assert_same_loss_and_gradients(ours, reference, our_loss, reference_loss, tmp_path)


@pytest.mark.parametrize("task", ["normal", "pointmap", "matting"])
def test_models_without_reference_loss_return_their_recipe(task, tmp_path):
    from tiny_models import write_tiny_checkpoint

    from sapiens2 import from_pretrained

    size = (160, 96) if task == "pointmap" else (64, 48)
    directory = write_tiny_checkpoint(
        tmp_path, task, size="1b", image_size=size if task == "pointmap" else None
    )
    model = from_pretrained(directory, device="cpu", dtype=torch.float32).train()
    model.backbone.augment_positions = False
    generator = torch.Generator().manual_seed(0)
    pixel_values = torch.randn(2, 3, *size, generator=generator)
    mask = (torch.rand(2, 1, *size, generator=generator) > 0.2).float()
    with torch.no_grad():
        output = model(pixel_values)
    if task == "normal":
        labels = torch.nn.functional.normalize(torch.randn(2, 3, *size, generator=generator), dim=1)
        loss = model(pixel_values, labels=labels, label_weights=mask).loss
        expected = losses.normal_recipe(output.normals, labels, mask)
    elif task == "pointmap":
        labels = torch.rand(2, 3, *size, generator=generator) + 1
        intrinsics = torch.tensor([[100.0, 0, 48], [0, 100, 80], [0, 0, 1]]).expand(2, 3, 3)
        loss = model(pixel_values, labels=labels, label_weights=mask, intrinsics=intrinsics).loss
        scales = losses.CANONICAL_FOCAL_LENGTH / intrinsics[:, 0, 0:1]
        # Unlabelled points count as 0, as the official targets set them.
        expected = losses.pointmap_recipe(
            output.pointmaps, output.scales, labels * mask, mask, intrinsics, scales
        )
        assert set(expected) == set(losses.POINTMAP_WEIGHTS)
    else:
        labels = torch.rand(2, 4, *size, generator=generator)
        loss = model(pixel_values, labels=labels, label_weights=mask).loss
        expected = losses.matting_recipe(output.alphas, output.foregrounds, labels, mask)
        assert set(expected) == set(losses.MATTING_WEIGHTS)
    assert torch.allclose(loss, sum(expected.values()), rtol=1e-5)
    loss.backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_matting_terms_are_zero_for_a_perfect_prediction():
    generator = torch.Generator().manual_seed(0)
    alpha = torch.rand(1, 1, 40, 36, generator=generator)
    foreground = alpha * torch.rand(1, 3, 40, 36, generator=generator)
    terms = losses.matting_recipe(alpha, foreground, torch.cat([foreground, alpha], dim=1))
    assert set(terms) == set(losses.MATTING_WEIGHTS)
    assert all(value.abs().item() < 1e-6 for value in terms.values())


def test_silog_gradient_is_finite_for_a_perfect_prediction():
    depth = (torch.rand(2, 1, 8, 6) + 1).requires_grad_()
    loss = losses.silog_loss(depth, depth.detach(), torch.ones(2, 1, 8, 6))
    loss.backward()
    assert loss.item() == 0 and depth.grad.isfinite().all()
