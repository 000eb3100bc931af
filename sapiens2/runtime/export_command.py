"""`sapiens2 export TASK --out FILE.onnx`: a task's model as an ONNX file (argument parsing only)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from sapiens2.errors import Sapiens2Error
from sapiens2.models.hub import use_checkpoint_dir
from sapiens2.runtime.onnx_files import export_names, export_task


def build_parser() -> argparse.ArgumentParser:
    """The export command's arguments."""
    parser = argparse.ArgumentParser(
        prog="sapiens2 export",
        description="Write a task's model as an ONNX file (float32, the input size of the checkpoint's "
        "preprocessor, any batch size) and FILE.json beside it with the input size, normalization and labels "
        "that pre- and post-processing need. Runs in ONNX Runtime, TensorRT, OpenVINO, the browser.",
    )
    parser.add_argument("task", choices=export_names(), help="the task (or model kind) of the model")
    parser.add_argument(
        "--model", metavar="ID_OR_PATH", help="a Hub repo id, checkpoint folder or .safetensors file "
        "(default: the task's default model)"
    )  # fmt: skip
    parser.add_argument("--out", required=True, type=Path, metavar="FILE.onnx", help="the file to write")
    parser.add_argument(
        "--checkpoint-dir", type=Path, metavar="DIR", help="local checkpoints: DIR/<repo id>/config.json + "
        "model.safetensors"
    )  # fmt: skip
    return parser


def main(argv: Sequence[str]) -> int:
    """Export; returns the exit status (0, or 1 when the model cannot be read or exported)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out.suffix.lower() != ".onnx":
        parser.error(f"--out must name a .onnx file, got {args.out}")
    if args.checkpoint_dir is not None:
        use_checkpoint_dir(args.checkpoint_dir)
    try:
        model_file, description = export_task(args.task, args.out, args.model)
    except (Sapiens2Error, OSError) as error:
        print(f"sapiens2 export: {error}")
        return 1
    print(f"wrote {model_file} and {description}")
    return 0
