"""Ahead-of-time compilation of the backbones' repeated transformer block (regional: one compiled program per
block layout, each block running it on its own weights), with the eager block kept as the fallback.

The steps are torch's: capture a block's call while the model runs an example, `torch.export` the block with a
dynamic batch, compile the exported program to an AOTInductor package, load the package once per block with
that block's tensors as its constants. Capturing, compiling and loading are passed in (`Compiler`), so a host
with its own helpers (a ZeroGPU Space: `sapiens2.serving.zerogpu`) runs the same path; `local_compiler()` is
torch's AOTInductor on this machine.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sapiens2.models.backbone import VisionTransformer

log = logging.getLogger("sapiens2.aot")

MAX_BATCH = 64  # the largest batch the compiled blocks take (a batch of photos or of pose crops)
EXAMPLE_BATCH = 2  # export specializes a batch of 1, so the example has 2


@dataclass
class CapturedCall:
    """The arguments of the call a `capture` context stopped."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None


class _Captured(Exception):
    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]):
        super().__init__()
        self.call_args, self.call_kwargs = args, kwargs


@contextlib.contextmanager
def capture_call(module: nn.Module) -> Iterator[CapturedCall]:
    """Within the block, the first call of `module` is stopped and its arguments recorded (what
    `spaces.aoti_capture` does)."""
    call = CapturedCall()

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise _Captured(args, kwargs)

    module.forward = stop
    try:
        yield call
    except _Captured as captured:
        call.args, call.kwargs = captured.call_args, captured.call_kwargs
    finally:
        del module.forward


@dataclass(frozen=True)
class Compiler:
    """How a host captures a call, compiles an exported program to package bytes and loads a package with a
    block's tensors as its constants."""

    capture: Callable[[nn.Module], contextlib.AbstractContextManager]
    compile: Callable[[torch.export.ExportedProgram], bytes]
    load: Callable[[bytes, dict[str, Tensor]], Callable[..., Any]]


def local_compiler() -> Compiler:
    """torch's AOTInductor on this machine (a C++ compiler is needed), constants kept out of the package."""
    return Compiler(capture_call, compile_package, load_package)


def compile_package(exported: torch.export.ExportedProgram) -> bytes:
    """The AOTInductor package of `exported`, its weights left out (each block brings its own)."""
    with tempfile.TemporaryDirectory() as folder:
        path = torch._inductor.aoti_compile_and_package(
            exported,
            package_path=os.path.join(folder, "block.pt2"),
            inductor_configs={"aot_inductor.package_constants_in_so": False},
        )
        return Path(path).read_bytes()


def load_package(
    archive: bytes,
    weights: dict[str, Tensor],
    unpacking: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    copies: bool = False,
) -> Callable[..., Any]:
    """A compiled package loaded with `weights` as its constants (unpacked within `unpacking()`): the
    tensors themselves, or with `copies` copies that the package owns."""
    with unpacking():
        runner = torch._inductor.aoti_load_package(io.BytesIO(archive))
    names = runner.get_constant_fqns()
    constants = {name: weights[name].detach().clone() if copies else weights[name] for name in names}
    runner.load_constants(constants, check_full_update=True, user_managed=not copies)
    return runner


# ---- which blocks, and their layouts -----------------------------------------------------------------------


def backbones(model: nn.Module) -> list[VisionTransformer]:
    """The vision transformers in `model` (the model itself for the pretrained backbone)."""
    return [module for module in model.modules() if isinstance(module, VisionTransformer)]


def block_tensors(block: nn.Module) -> dict[str, Tensor]:
    """The block's own parameter and buffer objects by name (not `state_dict`'s detached copies: a host may
    swap their data after they are taken, as ZeroGPU does in its workers)."""
    return {**dict(block.named_parameters()), **dict(block.named_buffers())}


def layout(block: nn.Module, tokens: Tensor) -> tuple:
    """What a compiled block depends on: its tensors' names, shapes and dtypes, and its input's per-photo
    shape, dtype and device type."""
    tensors = tuple((name, tuple(t.shape), t.dtype) for name, t in block_tensors(block).items())
    return (tensors, tuple(tokens.shape[1:]), tokens.dtype, tokens.device.type)


def example_pixels(vit: VisionTransformer, image_size: tuple[int, int]) -> Tensor:
    """A batch of random photos of `image_size` in the backbone's dtype and device."""
    weight = vit.patch_embed.projection.weight
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(EXAMPLE_BATCH, 3, *image_size, generator=generator)
    return pixels.to(device=weight.device, dtype=weight.dtype)


# ---- export and compile ---------------------------------------------------------------------------------


@dataclass
class ExportedBlock:
    """A block layout's exported program, with the block and the call it was exported from (to check the
    compiled program against)."""

    program: torch.export.ExportedProgram
    block: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@torch.inference_mode(False)
def export_blocks(
    model: nn.Module, image_size: tuple[int, int], capture: Callable, known: Container[tuple] = ()
) -> dict[tuple, ExportedBlock]:
    """Each distinct block layout of `model`'s backbones, exported with a dynamic batch from the call it gets
    when the backbone runs a batch of photos of `image_size`: {layout: exported block}. Layouts in `known`
    (compiled already, for another model of the same width) are left out."""
    exported: dict[tuple, ExportedBlock] = {}
    seen: set[tuple] = set(known)
    for vit in backbones(model):
        pixels = example_pixels(vit, image_size)
        for block in vit.blocks:
            with torch.no_grad():
                tokens, rope, _ = vit.embed(pixels)
            key = layout(block, tokens)
            if key in seen:
                continue
            seen.add(key)
            with torch.no_grad(), capture(block) as call:
                block(tokens, rope)
            if not call.args:
                raise RuntimeError(f"the call of a {type(block).__name__} was not captured")
            batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
            shapes = ({0: batch}, tuple(None for _ in call.args[1])) if call.args[1] is not None else None
            kwargs = call.kwargs or {}
            program = torch.export.export(block, call.args, kwargs, dynamic_shapes=shapes)
            exported[key] = ExportedBlock(program, block, call.args, kwargs)
    return exported


def check_compiled(package: bytes, exported: ExportedBlock, load: Callable) -> None:
    """Load `package` with the block's own tensors and run it on the exported call, and on its first photo
    alone (a batch of 1, the commonest request): a program that fails or disagrees with the eager block
    raises here, where the whole compile can fall back to eager (on ZeroGPU this runs in the compiling
    worker, so even a crash of the loaded program costs only that worker)."""
    runner = load(package, block_tensors(exported.block))
    tokens, *rest = exported.args
    for batch in (tokens, tokens[:1]):
        args = (batch, *rest)
        with torch.no_grad():
            expected = exported.block(*args, **exported.kwargs)
            actual = runner(*args, **exported.kwargs)
        if isinstance(actual, (list, tuple)):
            actual = actual[0]
        tolerance = 1e-3 if expected.dtype == torch.float32 else 3e-2
        expected, actual = expected.float(), actual.float()
        error = float((actual - expected).norm() / expected.norm().clamp_min(1e-12))
        if not error <= tolerance:
            raise RuntimeError(
                f"a compiled block disagrees with eager at a batch of {len(batch)} "
                f"(relative error {error:.3g} > {tolerance})"
            )


def compile_models(
    models: Iterable[nn.Module], image_sizes: Iterable[tuple[int, int]], compiler: Compiler
) -> dict[tuple, bytes]:
    """{block layout: compiled package} for every distinct block layout of `models` (run at `image_sizes`),
    each exported and compiled once (models of one width share their layouts) and checked against its eager
    block before it is returned."""
    packages: dict[tuple, bytes] = {}
    for model, image_size in zip(models, image_sizes, strict=True):
        started = time.perf_counter()
        exported = export_blocks(model, image_size, compiler.capture, known=packages.keys())
        if exported:
            log.info("%d block layouts exported in %.1f s", len(exported), time.perf_counter() - started)
        for key, block in exported.items():
            started = time.perf_counter()
            packages[key] = compiler.compile(block.program)
            check_compiled(packages[key], block, compiler.load)
            log.info("a block layout compiled and checked in %.1f s", time.perf_counter() - started)
    return packages


# ---- applied: every block runs its compiled program, or eager ----------------------------------------------


class Fallback:
    """Eager from the first failure on, for every block that shares it, said in one log line; the first load
    of a compiled block in each process is said too."""

    def __init__(self) -> None:
        self.failed = False
        self.lock = threading.Lock()
        self.loaded_in: set[int] = set()

    def loading(self) -> None:
        with self.lock:
            if os.getpid() in self.loaded_in:
                return
            self.loaded_in.add(os.getpid())
        log.info("compiled blocks loaded in process %d", os.getpid())

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if self.failed:
                return
            self.failed = True
        log.warning("ahead-of-time compiled blocks failed, running eager from now on: %s", error)


class CompiledBlock:
    """A block's forward: its compiled program when the input has the compiled layout, else the block's own
    eager forward. The program is loaded on first use in each process (a forked worker loads its own)."""

    def __init__(self, block: nn.Module, key: tuple, archive: bytes, load: Callable, fallback: Fallback):
        self.block, self.key, self.archive, self.load, self.fallback = block, key, archive, load, fallback
        self.eager = type(block).forward.__get__(block)
        self._runner: tuple[int, Callable] | None = None
        self._lock = threading.Lock()
        self.compiled_calls = 0

    def __call__(self, tokens: Tensor, rope: Any) -> Tensor:
        fits = 1 <= len(tokens) <= MAX_BATCH and layout(self.block, tokens) == self.key
        if self.fallback.failed or not fits:
            return self.eager(tokens, rope)
        try:
            result = self.runner()(tokens, rope)
        except Exception as error:  # any failure of the compiled program: eager, for good
            self.fallback.fail(error)
            return self.eager(tokens, rope)
        self.compiled_calls += 1
        return result

    def runner(self) -> Callable:
        with self._lock:
            if self._runner is None or self._runner[0] != os.getpid():
                self.fallback.loading()
                self._runner = (os.getpid(), self.load(self.archive, block_tensors(self.block)))
            return self._runner[1]


def apply_compiled(
    models: Iterable[nn.Module],
    packages: dict[tuple, bytes],
    load: Callable,
    fallback: Fallback | None = None,
) -> list[CompiledBlock]:
    """Every block of `models` whose layout was compiled runs its package from now on (see `CompiledBlock`);
    the blocks so changed."""
    fallback = fallback or Fallback()
    applied = []
    layouts = {key[0]: key for key in packages}
    for model in models:
        for vit in backbones(model):
            for block in vit.blocks:
                tensors = tuple((name, tuple(t.shape), t.dtype) for name, t in block_tensors(block).items())
                key = layouts.get(tensors)
                if key is not None:
                    block.forward = CompiledBlock(block, key, packages[key], load, fallback)
                    applied.append(block.forward)
    return applied


def compiled_or_eager(
    models: Iterable[nn.Module],
    compile_step: Callable[[], dict[tuple, bytes]],
    load: Callable,
    fallback: Fallback | None = None,
) -> list[CompiledBlock]:
    """`compile_step()`'s packages applied to `models` (see `apply_compiled`); on any failure the models stay
    eager, said in one log line, and no block is changed."""
    models = list(models)
    try:
        return apply_compiled(models, compile_step(), load, fallback)
    except Exception as error:
        remove_compiled(models)
        text = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
        log.warning("ahead-of-time compilation failed, the models run eager: %s", reason)
        return []


def remove_compiled(models: Iterable[nn.Module]) -> None:
    """Every block back to its eager forward."""
    for model in models:
        for vit in backbones(model):
            for block in vit.blocks:
                if isinstance(block.__dict__.get("forward"), CompiledBlock):
                    del block.forward
