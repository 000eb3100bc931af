"""CPU training step (forward, loss, backward, AdamW step) of pose and segmentation models: this package
against transformers, same weights, same loss (the reference's `labels=` loss), same optimizer.

Random weights are saved with transformers' `save_pretrained` and loaded into both. Step times are the CPU
time of the process (one thread by default), with the two implementations' steps alternating, so that load
from other processes hits both alike; the median per-run ratio is printed. Peak memory is measured apart, in
one fresh process per implementation: the resident memory a step adds at its peak (Linux `VmHWM` after
resetting it through /proc/self/clear_refs), after a first step has allocated the optimizer state.

    python -m bench.bench_train_cpu [--runs 10] [--batch 2] [--height 256] [--width 192] [--task pose]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from sapiens2 import from_pretrained

ROOT = Path(__file__).resolve().parents[1]


def write_checkpoint(directory: Path, task: str, hidden: int, layers: int, size: tuple[int, int]) -> Path:
    """Random weights of a task model with the official head layout at a quarter of its widths."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import write_transformers_checkpoint

    from sapiens2.models import kinds, presets

    config = presets.preset_config("0.4b", (kinds.POSE if task == "pose" else kinds.SEG).name)
    heads = hidden // 64
    config.update(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_attention_heads=heads // 2,
        num_first_full_attention_layers=layers // 4,
        num_last_full_attention_layers=layers // 4,
        image_size=list(size),
    )
    head = config["head_config"]
    for key in ("upsample_out_channels", "conv_out_channels"):
        head[key] = [channels // 4 for channels in head[key]]
    return write_transformers_checkpoint(directory, config)


def load(directory: Path, which: str) -> torch.nn.Module:
    if which == "ours":
        model = from_pretrained(directory, device="cpu", dtype=torch.float32)
        for parameter in model.parameters():
            parameter.data = parameter.data.clone()
        return model.train()
    architecture = json.loads((directory / "config.json").read_text())["architectures"][0]
    return getattr(transformers, architecture).from_pretrained(directory).train()


def batch(task: str, size: int, height: int, width: int, classes: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = {"pixel_values": torch.randn(size, 3, height, width, generator=generator)}
    if task == "pose":
        labels = torch.rand(size, classes, height // 4, width // 4, generator=generator)
        inputs |= {"labels": labels, "label_weights": torch.ones_like(labels)}
    else:
        inputs["labels"] = torch.randint(0, classes, (size, height, width), generator=generator)
    return inputs


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: dict[str, torch.Tensor]) -> float:
    """One training step; its CPU time (less disturbed than wall time by other processes on the machine)."""
    start = time.process_time()
    optimizer.zero_grad(set_to_none=True)
    model(**inputs).loss.backward()
    optimizer.step()
    return time.process_time() - start


def peak_added_mib(directory: Path, which: str, task: str, args: argparse.Namespace) -> float:
    """In this process: the resident memory a training step adds at its peak, in MiB."""
    model = load(directory, which)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = batch(task, args.batch, args.height, args.width, model.config.num_labels)
    step(model, optimizer, inputs)  # the optimizer state exists from here on
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    step(model, optimizer, inputs)
    return (_status_kib("VmHWM") - before) / 1024


def saved_for_backward_mib(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> float:
    """The memory autograd keeps from the forward pass for the backward pass: the distinct storages of the
    saved tensors, parameters left out, in MiB (exact, unlike resident memory)."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**inputs).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values()) / 2**20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_memory(directory: Path, which: str, task: str, args: argparse.Namespace) -> float:
    command = [
        sys.executable,
        "-m",
        "bench.bench_train_cpu",
        "--memory-of",
        which,
        "--checkpoint",
        str(directory),
    ]
    command += [
        "--task",
        task,
        "--batch",
        str(args.batch),
        "--height",
        str(args.height),
        "--width",
        str(args.width),
    ]
    output = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return float(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["pose", "seg"], action="append")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: CPU time is a fair measure)"
    )
    parser.add_argument("--memory-of", choices=["ours", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_of:
        print(peak_added_mib(args.checkpoint, args.memory_of, args.task[0], args))
        return

    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    print(
        f"hidden {args.hidden}, {args.layers} layers, batch {args.batch}, {args.height}x{args.width}, "
        f"{torch.get_num_threads()} threads, {versions}"
    )
    for task in args.task or ["pose", "seg"]:
        with tempfile.TemporaryDirectory() as folder:
            directory = write_checkpoint(
                Path(folder), task, args.hidden, args.layers, (args.height, args.width)
            )
            models = {which: load(directory, which) for which in ("reference", "ours")}
            optimizers = {which: torch.optim.AdamW(m.parameters(), lr=1e-4) for which, m in models.items()}
            inputs = batch(task, args.batch, args.height, args.width, models["ours"].config.num_labels)
            torch.manual_seed(0)
            reference_loss = models["reference"](**inputs).loss.item()
            torch.manual_seed(0)
            our_loss = models["ours"](**inputs).loss.item()
            times: dict[str, list[float]] = {"reference": [], "ours": []}
            for run in range(args.warmup + args.runs):
                for which in ("reference", "ours"):
                    elapsed = step(models[which], optimizers[which], inputs)
                    if run >= args.warmup:
                        times[which].append(elapsed)
            memory = {which: measure_memory(directory, which, task, args) for which in ("reference", "ours")}
            saved = {which: saved_for_backward_mib(model, inputs) for which, model in models.items()}
        medians = {which: 1e3 * statistics.median(values) for which, values in times.items()}
        paired = statistics.median(o / r for o, r in zip(times["ours"], times["reference"], strict=True))
        print(f"\n{task}: first loss ours {our_loss:.6f}, reference {reference_loss:.6f}")
        print(f"  step CPU time  reference {medians['reference']:.0f} ms, ours {medians['ours']:.0f} ms")
        ratio = medians["ours"] / medians["reference"]
        print(f"  ratio ours / reference: {ratio:.3f} (median of per-run ratios: {paired:.3f})")
        print(
            f"  peak added by a step  reference {memory['reference']:.0f} MiB, ours {memory['ours']:.0f} MiB"
        )
        print(f"  memory ratio ours / reference: {memory['ours'] / memory['reference']:.3f}")
        print(f"  saved for backward  reference {saved['reference']:.1f} MiB, ours {saved['ours']:.1f} MiB")
        print(f"  saved ratio ours / reference: {saved['ours'] / saved['reference']:.3f}")


if __name__ == "__main__":
    main()
