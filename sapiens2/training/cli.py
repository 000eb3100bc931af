"""`sapiens2 train TASK --data DIR --model REPO_OR_PATH --out DIR`: fine-tune a task on your own data.

One process by default; `accelerate launch -m sapiens2 train ...` runs the same command data-parallel on
every GPU of a machine or across machines.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from sapiens2.errors import CheckpointError, ConfigError, TrainingError
from sapiens2.models.hub import CHECKPOINT_DIR_ENV, use_checkpoint_dir
from sapiens2.settings import Settings, installed
from sapiens2.training import optim
from sapiens2.training.datasets import __doc__ as LAYOUTS
from sapiens2.training.tasks import TASKS
from sapiens2.training.trainer import PRECISIONS, TrainOptions, train

EXIT_OK, EXIT_FAILED = 0, 1


def _positive(kind: type):
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return convert


def _size(text: str) -> tuple[int, int]:
    parts = text.lower().replace("*", "x").split("x")
    try:
        height, width = (int(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH such as 1024x768, got {text!r}") from None
    if height <= 0 or width <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return height, width


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sapiens2 train",
        description="Fine-tune a Sapiens2 task on your own data with the official recipe "
        "(losses, AdamW with layer-wise decay, warmup then linear decay, gradient clipping at 2, matting 4).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Dataset layouts:\n" + LAYOUTS.split("\n\n", 1)[1],
    )
    aliases = [f"{alias} for {task.name}" for task in TASKS.values() for alias in task.aliases]
    parser.add_argument(
        "task",
        choices=[name for task in TASKS.values() for name in (task.name, *task.aliases)],
        help=f"the task to train (its checkpoints' names work too: {', '.join(aliases)})",
    )
    parser.add_argument("--data", required=True, type=Path, metavar="DIR", help="the training dataset folder")
    parser.add_argument(
        "--model",
        required=True,
        metavar="REPO_OR_PATH",
        help="the checkpoint to start from: a task model (e.g. facebook/sapiens2-pose-0.4b) or a pretrained "
        "backbone (facebook/sapiens2-pretrain-0.4b, which gets a new head); a Hub id, folder or .safetensors",
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        metavar="DIR",
        help=f"local checkpoints: a --model repo id is read from DIR/<repo id>/ before the Hub (default: "
        f"${CHECKPOINT_DIR_ENV})",
    )
    parser.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="where checkpoints and logs go"
    )
    parser.add_argument("--val", type=Path, metavar="DIR", help="a validation dataset folder (same layout)")

    length = parser.add_argument_group("length").add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=_positive(int), metavar="N", help="optimizer steps")
    length.add_argument("--epochs", type=_positive(float), metavar="E", help="passes over the training data")

    recipe = parser.add_argument_group("recipe (official defaults)")
    recipe.add_argument(
        "--batch-size", type=_positive(int), default=2, help="images per process and step (2)"
    )
    recipe.add_argument("--lr", type=_positive(float), default=5e-4, help="peak learning rate (5e-4)")
    recipe.add_argument(
        "--layer-decay",
        type=_positive(float),
        help="learning-rate factor per block from the head (the task's official one: 0.8, matting 0.9)",
    )
    recipe.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        help=f"linear warmup steps (default {optim.OFFICIAL_WARMUP}, or 5%% of a shorter run)",
    )
    recipe.add_argument("--seed", type=int, default=0, help="data order, augmentation and new layers (0)")
    recipe.add_argument(
        "--input-size",
        type=_size,
        metavar="HxW",
        help="model input size (default: the checkpoint's preprocessor_config.json, else its image_size)",
    )
    recipe.add_argument(
        "--sigma", type=_positive(float), help="pose heatmap Gaussian sigma (default: 6 at 1024x768)"
    )
    recipe.add_argument(
        "--no-augment",
        action="store_true",
        help="train on the photos as they are (no random scale, flip, colour)",
    )
    recipe.add_argument(
        "--new-labels",
        action="store_true",
        help="the dataset has another number of keypoints or classes than the checkpoint: new last layer",
    )

    memory = parser.add_argument_group("memory and speed")
    memory.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        help="mixed precision (default: bf16 on a CUDA GPU, else fp32)",
    )
    memory.add_argument(
        "--grad-checkpointing",
        action="store_true",
        help="recompute each block's activations in the backward pass (what makes 1b and 5b fit)",
    )
    memory.add_argument("--freeze-backbone", action="store_true", help="train the decode head only")
    memory.add_argument("--workers", type=int, help="data loading processes per training process (default 4)")

    run = parser.add_argument_group("run")
    run.add_argument(
        "--resume",
        nargs="?",
        const=True,
        metavar="DIR",
        help="continue from the latest checkpoint of --out (or of DIR, or the checkpoint folder DIR)",
    )
    run.add_argument(
        "--save-every", type=_positive(int), default=1000, metavar="N", help="checkpoint every N steps"
    )
    run.add_argument(
        "--val-every", type=_positive(int), metavar="N", help="validate every N steps (--save-every)"
    )
    run.add_argument(
        "--log-every",
        type=_positive(int),
        metavar="N",
        help="log every N steps (default 10, or often enough for 20 points in a shorter run)",
    )
    run.add_argument("--keep", type=_positive(int), default=3, metavar="K", help="checkpoints kept (3)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def options_from(args: argparse.Namespace) -> TrainOptions:
    """TrainOptions from parsed arguments."""
    resume = None if args.resume is None else (args.out if args.resume is True else Path(args.resume))
    extra = {} if args.workers is None else {"workers": args.workers}
    return TrainOptions(
        task=args.task,
        data=args.data,
        model=args.model,
        out=args.out,
        val=args.val,
        steps=args.steps,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        layer_decay=args.layer_decay,
        warmup=args.warmup,
        precision=args.precision,
        grad_checkpointing=args.grad_checkpointing,
        freeze_backbone=args.freeze_backbone,
        resume=resume,
        seed=args.seed,
        new_labels=args.new_labels,
        input_size=args.input_size,
        sigma=args.sigma,
        save_every=args.save_every,
        val_every=args.val_every,
        log_every=args.log_every,
        keep=args.keep,
        augment=not args.no_augment,
        progress=not args.no_progress,
        **extra,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run `sapiens2 train`; 0 when the run finished or stopped with a checkpoint, 1 when it could not run."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        with installed(Settings.read()):
            if args.checkpoint_dir is not None:
                use_checkpoint_dir(args.checkpoint_dir)
            run = train(options_from(args))
    except (TrainingError, CheckpointError, ConfigError) as error:
        print(f"sapiens2 train: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"Model: {run.folder}")
    return EXIT_OK
