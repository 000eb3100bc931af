"""Ahead-of-time compilation of the backbones' blocks on the CPU: torch.export and AOTInductor (gcc) on tiny
models, the same path a ZeroGPU Space takes with spaces' helpers. Compiled outputs within 1e-4 of eager, a
batch size or an input the program was not compiled for runs eager, and any failure means eager results
after exactly one log line."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from tiny_models import tiny_config

from sapiens2.models import aot
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.modeling import build_model

SIZE = (128, 96)


def tiny_model(task: str, seed: int, **overrides) -> torch.nn.Module:
    # Every block with full attention: one block layout, so one compile serves the whole module.
    config = tiny_config(task, image_size=SIZE, **{"num_key_value_attention_heads": 4, **overrides})
    torch.manual_seed(seed)
    return build_model(Sapiens2Config.from_dict(config)).eval()


def outputs(model: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        result = model(pixels)
    return result.logits if hasattr(result, "logits") else result.heatmaps


def aot_warnings(caplog) -> list[str]:
    records = caplog.records
    return [r.getMessage() for r in records if r.name == "sapiens2.aot" and r.levelno >= logging.WARNING]


@pytest.fixture(scope="module")
def compiled():
    if shutil.which("gcc") is None and shutil.which("g++") is None:
        pytest.skip("AOTInductor needs a C++ compiler")
    segment = tiny_model("seg", seed=0)
    packages = aot.compile_models([segment], [SIZE], aot.local_compiler())
    return segment, packages


def test_exported_blocks_match_eager():
    model = tiny_model("seg", seed=3, num_key_value_attention_heads=2)  # grouped in the middle block
    programs = aot.export_blocks(model, SIZE, aot.capture_call)
    assert len(programs) == 2  # full attention and grouped-query attention: two layouts
    vit = aot.backbones(model)[0]
    pixels = torch.randn(3, 3, *SIZE)  # a batch of 3 where the example had 2: the batch is dynamic
    with torch.no_grad():
        tokens, rope, _ = vit.embed(pixels)
        for block in vit.blocks:
            program = programs[aot.layout(block, tokens)].program.module()
            program.load_state_dict(block.state_dict())
            torch.testing.assert_close(program(tokens, rope), block(tokens, rope), atol=1e-5, rtol=1e-5)


def test_compiled_blocks_match_eager_within_1e_4(compiled, caplog):
    segment, packages = compiled
    pixels = torch.randn(3, 3, *SIZE)
    eager = outputs(segment, pixels)
    blocks = aot.apply_compiled([segment], packages, aot.load_package)
    try:
        assert len(blocks) == 3
        torch.testing.assert_close(outputs(segment, pixels), eager, atol=1e-4, rtol=0)
        assert all(block.compiled_calls == 1 for block in blocks)
        # Another model of the same widths runs the same programs on its own weights.
        pose = tiny_model("pose", seed=1)
        eager_pose = outputs(pose, pixels[:1])
        pose_blocks = aot.apply_compiled([pose], packages, aot.load_package)
        torch.testing.assert_close(outputs(pose, pixels[:1]), eager_pose, atol=1e-4, rtol=0)
        assert all(block.compiled_calls == 1 for block in pose_blocks)
        # A photo of another size is not what was compiled: eager, unchanged.
        other = torch.randn(1, 3, 160, 128)
        aot.remove_compiled([segment])
        expected = outputs(segment, other)
        aot.apply_compiled([segment], packages, aot.load_package)
        assert torch.equal(outputs(segment, other), expected)
        assert aot_warnings(caplog) == []
    finally:
        aot.remove_compiled([segment])


def test_a_failing_program_means_eager_results_and_one_log_line(caplog):
    model = tiny_model("seg", seed=2)
    pixels = torch.randn(2, 3, *SIZE)
    eager = outputs(model, pixels)
    keys = aot.export_blocks(model, SIZE, aot.capture_call)
    blocks = aot.apply_compiled([model], {key: b"not a package" for key in keys}, aot.load_package)
    assert len(blocks) == 3
    assert torch.equal(outputs(model, pixels), eager)
    assert torch.equal(outputs(model, pixels), eager)
    assert len(aot_warnings(caplog)) == 1 and "failed" in aot_warnings(caplog)[0]
    assert all(block.compiled_calls == 0 for block in blocks)


class DataDependent(torch.nn.Module):
    """An attention whose branch depends on its input's values: torch.export cannot trace it."""

    def __init__(self, attention: torch.nn.Module):
        super().__init__()
        self.inner = attention
        self.num_heads, self.num_kv_heads = attention.num_heads, attention.num_kv_heads  # its shape, as read

    def forward(self, x, rope, residual=None):
        out = self.inner(x, rope, residual=residual)
        return out if bool(x.sum() > 0) else -out


def test_a_model_that_does_not_export_stays_eager_after_one_log_line(caplog):
    model = tiny_model("seg", seed=4)
    for block in aot.backbones(model)[0].blocks:
        block.attn = DataDependent(block.attn)
    pixels = torch.randn(2, 3, *SIZE)
    eager = outputs(model, pixels)
    compiler = aot.local_compiler()
    blocks = aot.compiled_or_eager(
        [model], lambda: aot.compile_models([model], [SIZE], compiler), aot.load_package
    )
    assert blocks == []
    assert all("forward" not in block.__dict__ for block in aot.backbones(model)[0].blocks)
    assert torch.equal(outputs(model, pixels), eager)
    warnings = aot_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith("ahead-of-time compilation failed"), warnings


@pytest.mark.parametrize("wrong", ["disagrees", "raises"])
def test_a_compiled_block_is_checked_against_eager_before_it_is_used(wrong, caplog):
    model = tiny_model("seg", seed=5)
    pixels = torch.randn(2, 3, *SIZE)
    eager = outputs(model, pixels)
    block = aot.backbones(model)[0].blocks[0]
    eager_block = type(block).forward.__get__(block)
    loaded = []

    def load(archive: bytes, weights: dict) -> object:
        def run(tokens, rope, **kwargs):
            if wrong == "raises":
                raise RuntimeError("the program cannot run")
            right = eager_block(tokens, rope)
            # Right for the example batch, wrong for one photo alone: the check runs both.
            return right if len(tokens) > 1 else right * 1.1

        loaded.append(sorted(weights))
        return run

    compiler = aot.Compiler(aot.capture_call, lambda program: b"a package", load)
    with pytest.raises(RuntimeError, match="disagrees with eager at a batch of 1|cannot run"):
        aot.compile_models([model], [SIZE], compiler)
    assert loaded and all(names for names in loaded)  # loaded with the block's own tensors
    blocks = aot.compiled_or_eager([model], lambda: aot.compile_models([model], [SIZE], compiler), load)
    assert blocks == []
    assert torch.equal(outputs(model, pixels), eager)
    warnings = aot_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].startswith("ahead-of-time compilation failed"), warnings


def test_models_of_one_width_export_and_compile_each_block_layout_once():
    """Pose, body parts and the grouped-attention variant: the first two share one layout, the third adds its
    second; each layout is captured, exported, compiled and checked exactly once."""
    models = [
        tiny_model("pose", seed=6),
        tiny_model("seg", seed=7),
        tiny_model("seg", seed=8, num_key_value_attention_heads=2),
    ]
    captured, compiled = [], []

    def capture(block):
        captured.append(block)
        return aot.capture_call(block)

    def compile_program(program):
        compiled.append(program)
        return str(len(compiled) - 1).encode()

    def load(archive: bytes, weights: dict):
        module = compiled[int(archive)].module()
        module.load_state_dict(weights)
        return module

    packages = aot.compile_models(models, [SIZE] * 3, aot.Compiler(capture, compile_program, load))
    assert len(packages) == len(compiled) == len(captured) == 2
    blocks = [block for model in models for block in aot.backbones(model)[0].blocks]
    assert len({aot.layout(block, torch.zeros(1, 1)) for block in blocks}) == 2
