"""Every model class against transformers' Sapiens2 in float32, both loading one save_pretrained output."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tiny_models import ALL_REPO_IDS, tiny_config, write_tiny_checkpoint, write_transformers_checkpoint

from sapiens2 import from_pretrained
from sapiens2.errors import ConfigError
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.layers import Attention, Linear
from sapiens2.models.modeling import build_model

TOLERANCE = 1e-5
INPUT = (2, 3, 64, 48)  # non-square, and not the config's 1024x768 image_size

CASES = {
    "model": (tiny_config("pretrain"), INPUT),
    "backbone": (
        tiny_config(
            "pretrain", architectures=["Sapiens2Backbone"], out_indices=[0, 2, 3], return_class_token=True
        ),
        INPUT,
    ),
    "backbone-raw-tokens": (
        tiny_config(
            "pretrain",
            architectures=["Sapiens2Backbone"],
            out_indices=[1, 3],
            normalize_backbone_outputs=False,
            reshape_hidden_states=False,
        ),
        INPUT,
    ),
    "model-without-qk-norm-or-key-bias": (tiny_config("pretrain", use_qk_norm=False, key_bias=False), INPUT),
    "pose": (tiny_config("pose", "1b"), INPUT),
    "seg": (tiny_config("seg"), INPUT),
    "normal": (tiny_config("normal", "5b"), INPUT),
    # The scale branch halves the patch grid three times; 10x6 patches keep more than one pixel at the end.
    "pointmap": (tiny_config("pointmap", image_size=(160, 96)), (2, 3, 160, 96)),
    "matting": (tiny_config("matting", "1b"), INPUT),
}


def load_ours(directory: Path) -> torch.nn.Module:
    return from_pretrained(directory, device="cpu", dtype=torch.float32)


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).norm() / reference.norm())


def assert_same_outputs(ours: object, reference: object) -> None:
    """Every field of our output equals the reference's field of the same name."""
    for name, value in vars(ours).items():
        expected = getattr(reference, name)
        if value is None:
            assert expected is None, name
            continue
        pairs = zip(value, expected, strict=True) if isinstance(value, tuple) else [(value, expected)]
        for mine, theirs in pairs:
            assert mine.shape == theirs.shape, name
            assert relative_error(mine, theirs) <= TOLERANCE, name


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    config, shape = CASES[request.param]
    directory = write_transformers_checkpoint(tmp_path_factory.mktemp(request.param), config)
    reference = getattr(transformers, config["architectures"][0]).from_pretrained(directory).eval()
    pixel_values = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    return reference, load_ours(directory), pixel_values


def test_outputs_match_reference(case):
    reference, ours, pixel_values = case
    with torch.no_grad():
        expected = reference(pixel_values)
    with torch.inference_mode():
        actual = ours(pixel_values)
    assert_same_outputs(actual, expected)


def test_pose_flip_back_matches_reference(tmp_path):
    directory = write_tiny_checkpoint(tmp_path, "pose")
    reference = transformers.Sapiens2ForPoseEstimation.from_pretrained(directory).eval()
    ours = load_ours(directory)
    assert len(ours.config.flip_pairs) > 100
    flipped = torch.randn(INPUT, generator=torch.Generator().manual_seed(2)).flip(-1)
    with torch.no_grad():
        expected = reference(flipped, flip_pairs=torch.tensor(ours.config.flip_pairs))
        actual = ours(flipped, flip_pairs=ours.config.flip_pairs)
        unflipped = ours(flipped)
    assert_same_outputs(actual, expected)
    assert relative_error(unflipped.heatmaps, actual.heatmaps) > 0.1


@pytest.mark.parametrize(
    ("upsample_kernels", "conv_kernels", "reference_size"),
    [([3, 3], [1, 1, 1], (13, 9)), ([2, 2], [1, 1, 1], (10, 6)), ([4, 4], [3, 3, 1], (12, 8))],
)
def test_deconv_head_sizes_follow_upstream_where_transformers_differs(
    upsample_kernels, conv_kernels, reference_size, tmp_path
):
    """transformers pads every transposed conv by 1 and a deconv head's refinement convs by 0, so kernels of
    2 or 3, or 3x3 refinement convs, shrink its heatmaps; ours keep upstream's 4x (see docs/fidelity.md and
    tests/test_upstream_parity.py). The checkpoint itself loads the same."""
    config = tiny_config("pose")
    config["head_config"].update(upsample_kernel_sizes=upsample_kernels, conv_kernel_sizes=conv_kernels)
    directory = write_transformers_checkpoint(tmp_path, config)
    reference = transformers.Sapiens2ForPoseEstimation.from_pretrained(directory).eval()
    pixel_values = torch.randn(INPUT, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert tuple(reference(pixel_values).heatmaps.shape[-2:]) == reference_size
    with torch.inference_mode():
        assert tuple(load_ours(directory)(pixel_values).heatmaps.shape[-2:]) == (16, 12)


def test_tiny_pose_keeps_official_labels():
    config = Sapiens2Config.from_dict(tiny_config("pose"))
    assert config.num_labels == 308
    assert config.id2label[0] == "nose"
    assert (1, 2) in config.flip_pairs


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("hidden_act", "tanh", "'tanh'"),
        ("use_gated_mlp", False, "False"),
        ("num_key_value_heads_per_layer", [4, 3, 4], "[4, 3, 4]"),
        ("architectures", ["Sapiens2ForDepthEstimation"], "'Sapiens2ForDepthEstimation'"),
    ],
)
def test_unsupported_value_names_field_and_value(field, value, shown):
    with pytest.raises(ConfigError) as error:
        build_model(Sapiens2Config.from_dict(tiny_config("pose", **{field: value})))
    assert f"{field}: {shown}" in str(error.value)


def test_unsupported_head_value_names_field():
    config = tiny_config("pointmap")
    config["head_config"]["scale_final_hidden_sizes"] = [8, 4, 2]
    with pytest.raises(ConfigError, match=r"head_config\.scale_final_hidden_sizes.*\[8, 4, 2\]"):
        Sapiens2Config.from_dict(config)


def test_tiny_mirror_has_every_official_repo(tiny_mirror):
    models = {repo_id: from_pretrained(tiny_mirror / repo_id, device="cpu") for repo_id in ALL_REPO_IDS}
    small = torch.zeros(1, 3, 64, 48)
    with torch.inference_mode():
        assert models["facebook/sapiens2-pose-1b"](small).heatmaps.shape == (1, 308, 16, 12)
        assert models["facebook/sapiens2-seg-5b"](small).logits.shape == (1, 29, 64, 48)
        assert models["facebook/sapiens2-matting-1b"](small).alphas.shape == (1, 1, 64, 48)
        # The scale branch's flattened input size fixes the pointmap input to about 1024x768.
        pointmap = models["facebook/sapiens2-pointmap-0.4b"](torch.zeros(1, 3, 1024, 768))
    assert pointmap.scales.shape == (1, 1)
    assert all(
        (tiny_mirror / repo_id / "model.safetensors").stat().st_size < 2_000_000 for repo_id in ALL_REPO_IDS
    )


def test_linear_matches_torch_with_and_without_gradients():
    layer = Linear(16, 8)
    x = torch.randn(2, 5, 16, requires_grad=True)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    with torch.inference_mode():
        assert relative_error(layer(x.detach()), expected.detach()) <= TOLERANCE
    layer(x).square().sum().backward()
    mine = x.grad.clone()
    x.grad = None
    expected.square().sum().backward()
    assert torch.allclose(mine, x.grad)


# ---- q/k/v stored as one projection -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pose_checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("pose"), "pose")


def attentions(model: torch.nn.Module) -> list[Attention]:
    found = [module for module in model.modules() if isinstance(module, Attention)]
    assert found
    return found


def assert_fused(model: torch.nn.Module) -> None:
    """Inference reads each block's q, k and v parameters in place, as one projection."""
    for attention in attentions(model):
        with torch.inference_mode():
            weight, bias = attention.qkv_projection()
        assert weight.data_ptr() == attention.wq.weight.data_ptr()
        assert weight[attention.wq.out_features :].data_ptr() == attention.wk.weight.data_ptr()
        assert bias.data_ptr() == attention.wq.bias.data_ptr()


def test_fused_projections_keep_the_checkpoint_names_and_round_trip(pose_checkpoint, tmp_path):
    model = load_ours(pose_checkpoint)
    assert_fused(model)
    state = model.state_dict()
    # The checkpoint's names, and the RoPE periods that transformers' files lack.
    assert set(state) == {*load_file(pose_checkpoint / "model.safetensors"), "backbone.rope_embed.periods"}
    save_file(state, tmp_path / "model.safetensors")  # safetensors refuses overlapping tensors
    shutil.copy(pose_checkpoint / "config.json", tmp_path)
    reloaded = load_ours(tmp_path)
    assert_fused(reloaded)
    pixel_values = torch.randn(INPUT, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert torch.equal(model(pixel_values).heatmaps, reloaded(pixel_values).heatmaps)


def test_strict_loading_into_a_built_model_keeps_the_fusion(pose_checkpoint):
    model = build_model(Sapiens2Config.from_dict(tiny_config("pose")))
    model.load_state_dict(load_file(pose_checkpoint / "model.safetensors"), strict=True)
    assert_fused(model)
    pixel_values = torch.randn(INPUT, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        assert torch.equal(model(pixel_values).heatmaps, load_ours(pose_checkpoint)(pixel_values).heatmaps)


def test_conversions_and_copies_fuse_again(pose_checkpoint):
    model = load_ours(pose_checkpoint)
    pixel_values = torch.randn(INPUT, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        expected = model(pixel_values).heatmaps
    model.to(torch.bfloat16).float()
    assert_fused(model)
    with torch.inference_mode():
        assert relative_error(model(pixel_values).heatmaps, expected) < 1e-2
    copied = copy.deepcopy(model)
    assert_fused(copied)
    with torch.inference_mode():
        assert torch.equal(copied(pixel_values).heatmaps, model(pixel_values).heatmaps)


def test_a_replaced_parameter_is_used(pose_checkpoint):
    model = load_ours(pose_checkpoint)
    attention = attentions(model)[0]
    pixel_values = torch.randn(INPUT, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        before = model(pixel_values).heatmaps
    attention.wv.weight = torch.nn.Parameter(attention.wv.weight.detach() * 2)
    rebuilt = build_model(model.config)
    rebuilt.load_state_dict(model.state_dict())
    with torch.inference_mode():
        after = model(pixel_values).heatmaps
        assert relative_error(after, before) > 1e-3
        assert torch.equal(after, rebuilt.eval()(pixel_values).heatmaps)


def test_training_reaches_every_projection_and_inference_sees_the_step(pose_checkpoint):
    model = load_ours(pose_checkpoint).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    pixel_values = torch.randn(INPUT, generator=torch.Generator().manual_seed(7))
    model(pixel_values).heatmaps.square().mean().backward()
    for attention in attentions(model):
        for layer in (attention.wq, attention.wk, attention.wv):
            assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0
    optimizer.step()
    assert_fused(model)
    stepped = build_model(model.config)
    stepped.load_state_dict({name: tensor.clone() for name, tensor in model.state_dict().items()})
    with torch.inference_mode():
        expected = stepped.eval()(pixel_values).heatmaps
        assert torch.equal(model.eval()(pixel_values).heatmaps, expected)
