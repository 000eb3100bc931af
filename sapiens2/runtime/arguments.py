"""The flags that set up a Runtime (device, precision, local checkpoints, person detector), shared by the app
and the command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sapiens2.errors import ConfigError
from sapiens2.models import kernels
from sapiens2.models.device import DTYPES
from sapiens2.models.hub import CHECKPOINT_DIR_ENV, use_checkpoint_dir
from sapiens2.runtime.host import COMPILE_ENV
from sapiens2.runtime.onnx_backend import BACKENDS
from sapiens2.runtime.runtime import Runtime
from sapiens2.settings import current
from sapiens2.vision.detector import WEIGHTS_ENV, DetectorError, resolve_weights


def add_runtime_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--device, --dtype, --compile, --checkpoint-dir and --detector."""
    parser.add_argument(
        "--device",
        help="cpu, cuda, cuda:N or mps (default: $SAPIENS2_DEVICE, else cuda if any, else mps (an Apple GPU) "
        "if any, else cpu)",
    )
    parser.add_argument(
        "--dtype",
        choices=list(DTYPES),
        help="precision (default: $SAPIENS2_DTYPE, else the fast one: bf16 on CUDA and on CPUs with native "
        "bf16 (AVX-512 BF16 or AMX), else fp32, on an Apple GPU too; fp32 gives transformers' outputs, the "
        "precision that sapiens2.from_pretrained loads the official checkpoints in)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help=f"run the models through torch.compile (default: ${COMPILE_ENV}=1); the first run of each "
        "input shape then takes tens of seconds to minutes longer while it compiles",
    )
    parser.add_argument(
        "--backend",
        choices=list(BACKENDS),
        help="what runs the models' forwards: torch (default) or onnxruntime (on the CPU, in fp32: each "
        "model is exported to ONNX at its first photo, which takes seconds to a minute or more)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        metavar="DIR",
        help="local checkpoints: DIR/<repo id>/config.json + model.safetensors "
        f"(default: ${CHECKPOINT_DIR_ENV})",
    )
    parser.add_argument(
        "--detector",
        metavar="WEIGHTS",
        help="person detector for pose: an ultralytics model name or a local .pt file (default: yolo11m.pt)",
    )


def kernel_choices_file() -> Path:
    """Where the CPU kernel choices measured by the models are kept between runs: the user's cache folder
    ($XDG_CACHE_HOME, else ~/.cache), sapiens2/kernel-choices.json."""
    return Path(current().xdg_cache_home or Path.home() / ".cache") / "sapiens2" / kernels.FILE_NAME


def runtime_from_arguments(args: argparse.Namespace, **settings: Any) -> Runtime:
    """The Runtime the parsed flags ask for; ConfigError when a flag's value cannot be used."""
    kernels.remember_in(kernel_choices_file())
    if args.checkpoint_dir is not None:
        use_checkpoint_dir(args.checkpoint_dir)
    try:  # checked now, not at the first pose request, so the operator reads it and the flag it came from
        resolve_weights(args.detector)
    except DetectorError as error:
        flag = "--detector" if args.detector is not None else f"${WEIGHTS_ENV}"
        raise ConfigError(f"{flag}: {error}.") from None
    return Runtime(
        device=args.device,
        dtype=args.dtype,
        detector=args.detector,
        compile=args.compile,
        backend=args.backend,
        **settings,
    )
