"""The training loop on HF Accelerate: one plain process, or data-parallel under `accelerate launch` on the
GPUs of one machine or of many, with no change.

Data order: the samples form one stream, epoch after epoch, each epoch a permutation drawn from the seed;
global batch t is stream positions [t G, (t + 1) G) for G = --batch-size x processes, process r taking its
r-th slice. A sample's augmentation is drawn from (seed, stream position). So a run resumed at step t sees
exactly the batches the uninterrupted run saw, and P processes see the batches one process with the same
global batch sees.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Sampler
from tqdm import tqdm

from sapiens2.errors import TrainingError
from sapiens2.models.hub import processor_config_dir
from sapiens2.training import checkpoints, optim
from sapiens2.training.modeling import load_trainable
from sapiens2.training.records import RunRecord, log_interval
from sapiens2.training.samples import TaskSamples
from sapiens2.training.tasks import TrainingTask, get_training_task
from sapiens2.vision.processing import ProcessorSettings, size_text

log = logging.getLogger("sapiens2.train")

PRECISIONS = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
OPTIONS_NAME = "train_options.json"
# Options that decide the data order or what is trained: a resumed run must keep them.
FIXED_ON_RESUME = ("task", "seed", "global_batch_size", "total_steps")


@dataclass
class TrainOptions:
    """Everything `sapiens2 train` takes."""

    task: str
    data: Path
    model: str
    out: Path
    val: Path | None = None
    steps: int | None = None
    epochs: float | None = None
    batch_size: int = 2
    lr: float = 5e-4
    layer_decay: float | None = None  # the task's official one
    warmup: int | None = None
    precision: str | None = None
    grad_checkpointing: bool = False
    freeze_backbone: bool = False
    resume: Path | None = None
    seed: int = 0
    new_labels: bool = False
    input_size: tuple[int, int] | None = None
    sigma: float | None = None
    workers: int = field(default_factory=lambda: min(4, os.cpu_count() or 1))
    save_every: int = 1000
    val_every: int | None = None
    log_every: int | None = None  # records.log_interval: 10, or often enough for a short run
    keep: int = 3
    augment: bool = True
    progress: bool = True


class StreamBatches(Sampler):
    """This process's keys (record index, stream position) of each global batch from `start` to `stop`."""

    def __init__(self, count: int, batch_size: int, rank: int, world: int, start: int, stop: int, seed: int):
        self.count, self.batch_size, self.rank, self.world = count, batch_size, rank, world
        self.start, self.stop, self.seed = start, stop, seed

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        global_batch = self.batch_size * self.world
        for step in range(self.start, self.stop):
            first = step * global_batch + self.rank * self.batch_size
            yield [(self.record(position), position) for position in range(first, first + self.batch_size)]

    def record(self, position: int) -> int:
        return int(_permutation(self.seed, position // self.count, self.count)[position % self.count])


@lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, count: int) -> np.ndarray:
    return np.random.default_rng((seed, 0, epoch)).permutation(count)


def _quiet_worker(_: int) -> None:
    """Data workers leave Ctrl-C to the main process, which stops the run cleanly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _StopRequest:
    """Set by SIGINT / SIGTERM: the run finishes its step, saves a checkpoint and stops; a second signal
    stops at once (the signal's own default). While the run loads (its data, its model, the next batch) a
    signal ends it at once: a read that never returns (a file on a hung mount) must not hold the run."""

    def __init__(self, loading: bool = False) -> None:
        self.requested = False
        self.loading = loading
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _StopRequest:
        try:
            for number in (signal.SIGINT, signal.SIGTERM):
                self.previous[number] = signal.signal(number, self.handle)
        except ValueError:  # not the main thread: no handlers
            pass
        return self

    def handle(self, number: int, frame) -> None:
        self.requested = True
        signal.signal(number, self.previous.get(number, signal.SIG_DFL))
        if self.loading:
            raise TrainingError(
                f"stopped by {signal.Signals(number).name} while loading; nothing of this step was saved"
            )
        tqdm.write("Stopping after this step (a checkpoint is saved); press Ctrl-C again to stop at once.")

    def loading_from(self, batches: Iterable) -> Iterator:
        """The batches of `batches`, counting the wait for each as loading."""
        iterator = iter(batches)
        while True:
            self.loading = True
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self.loading = False
            yield batch

    def __exit__(self, *exc) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)


def training_settings(
    options: TrainOptions, task: TrainingTask, source: str, image_size: tuple[int, int]
) -> tuple[ProcessorSettings, str]:
    """The input size and normalization, as inference would use them: the checkpoint's
    preprocessor_config.json, else its kind's defaults at its config's `image_size`; with --input-size.
    Also where the size came from, in words for messages."""
    folder = processor_config_dir(source)
    if folder is not None:
        settings = ProcessorSettings.from_pretrained_dir(folder, task.kind, image_size)
        origin = "the size in the checkpoint's preprocessor_config.json"
    else:
        settings = ProcessorSettings.for_kind(task.kind, image_size)
        origin = "the checkpoint's image_size (config.json)"
    if options.input_size is not None:
        settings = replace(settings, height=options.input_size[0], width=options.input_size[1])
        origin = "--input-size"
    return settings, f"{origin} {size_text(settings.size)}"


def _check_scale_branch(model, settings: ProcessorSettings, origin: str) -> None:
    """A pointmap scale branch takes a fixed flattened size: the input size must produce it (the one size
    inference refuses too)."""
    if not model.config.accepts_input_size(settings.size):
        built = size_text(model.config.image_size)
        raise TrainingError(
            f"{origin} does not fit this checkpoint's focal-scale branch, built for {built} inputs; "
            f"train at --input-size {built}"
        )


def total_steps(options: TrainOptions, samples: int, global_batch: int) -> int:
    if options.steps is not None:
        return options.steps
    if options.epochs is not None:
        return max(1, math.ceil(options.epochs * samples / global_batch))
    raise TrainingError("give the run's length with --steps N or --epochs E")


def _device_batch(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {name: value.to(device, non_blocking=True) for name, value in batch.items()}


def _out_of_memory(error: BaseException) -> TrainingError:
    return TrainingError(
        f"Out of GPU memory ({error}). Try --grad-checkpointing (recomputes the backbone's activations), a "
        "smaller --batch-size (with more processes or steps), --precision bf16, or --freeze-backbone."
    )


@dataclass
class TrainingRun:
    """Where a run ended: its last step, the folder of its model (out/final, or the checkpoint it stopped
    at) and the trained model itself."""

    step: int
    folder: Path
    model: torch.nn.Module


def train(options: TrainOptions, stop: Callable[[int], bool] | None = None) -> TrainingRun:
    """Run the training described by `options`.

    `stop(step)` is asked after every step; True ends the run there with a checkpoint, as Ctrl-C does.
    """
    task = get_training_task(options.task)
    if options.precision == "fp16" and not torch.cuda.is_available():
        raise TrainingError("--precision fp16 needs a CUDA GPU; use bf16 or fp32 on the CPU")
    precision = options.precision or (
        "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    )
    # Without a GPU, processes started by `accelerate launch` or torchrun are data-parallel on the CPU (gloo).
    accelerator = Accelerator(
        mixed_precision=PRECISIONS[precision],
        cpu=not torch.cuda.is_available(),
        step_scheduler_with_optimizer=False,
    )
    main = accelerator.is_main_process
    out = options.out
    resume_from = None if options.resume is None else checkpoints.resume_folder(options.resume)
    if resume_from is None and checkpoints.checkpoints(out):
        raise TrainingError(
            f"--out {out} already holds checkpoints of a run: add --resume to continue it, or choose "
            "another --out"
        )
    with _StopRequest(loading=True):
        records, dataset_labels = task.read(options.data)
        source = str(resume_from) if resume_from is not None else options.model
        trainable = load_trainable(task, source, dataset_labels, options.new_labels, options.seed)
    model, labels, config = trainable.model, trainable.labels, trainable.config
    settings, origin = training_settings(
        options, task, str(resume_from or options.model), model.config.image_size
    )
    _check_scale_branch(model, settings, origin)
    output_size = model.config.head_output_size(settings.size)
    model.backbone.augment_positions = False  # the official fine-tuning recipes do not move RoPE positions
    model.backbone.gradient_checkpointing = options.grad_checkpointing
    if options.freeze_backbone:
        model.backbone.requires_grad_(False)
    train_set = task.samples(
        records, settings, labels, options.seed, options.sigma, options.augment, output_size
    )
    val_set = _validation_set(task, options, settings, labels, output_size)
    world = accelerator.num_processes
    global_batch = options.batch_size * world
    steps = total_steps(options, len(records), global_batch)
    warmup = optim.default_warmup(steps) if options.warmup is None else options.warmup
    layer_decay = task.layer_decay if options.layer_decay is None else options.layer_decay
    optimizer, scheduler = optim.build_optimizer(
        model, options.lr, layer_decay, warmup, steps, fused=accelerator.device.type == "cuda"
    )
    start = 0
    run = {"task": task.name, "seed": options.seed, "global_batch_size": global_batch, "total_steps": steps}
    if resume_from is not None:
        start = _resume(resume_from, run, optimizer, scheduler)
    model, optimizer = accelerator.prepare(model, optimizer)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / OPTIONS_NAME).write_text(json.dumps(_jsonable(asdict(options)) | run, indent=2) + "\n")
    record = RunRecord(out, start if resume_from is not None else None) if main else None
    sampler = StreamBatches(
        len(records), options.batch_size, accelerator.process_index, world, start, steps, options.seed
    )
    loader = DataLoader(
        train_set,
        batch_sampler=sampler,
        num_workers=options.workers,
        pin_memory=accelerator.device.type == "cuda",
        worker_init_fn=_quiet_worker if options.workers else None,
    )
    if main:
        where = f"{world} process{'es' if world > 1 else ''} on {accelerator.device.type}"
        log.info(
            "Training %s: %d samples, %d steps of %d images, %s, %s.",
            task.name,
            len(records),
            steps,
            global_batch,
            where,
            precision,
        )

    def save(step: int) -> None:
        if main:
            state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step}
            trainer_state = run | {
                "step": step,
                "samples_seen": step * global_batch,
                "model": options.model,
                "data": str(options.data),
            }
            checkpoints.save_checkpoint(
                out,
                step,
                accelerator.unwrap_model(model),
                config,
                settings,
                state,
                trainer_state,
                options.keep,
            )
            record.plot()
        accelerator.wait_for_everyone()

    val_every = options.val_every or options.save_every
    log_every = log_interval(options.log_every, steps)
    progress = tqdm(
        total=steps,
        initial=start,
        desc=f"train {task.name}",
        unit="step",
        disable=not (main and options.progress),
    )
    window: dict[str, torch.Tensor] = {}  # summed on the device: read (a sync) only when logged
    window_steps, window_start = 0, time.perf_counter()
    step = start
    with _StopRequest() as stop_request:
        for batch in stop_request.loading_from(loader):
            batch = _device_batch(batch, accelerator.device)
            try:
                with accelerator.autocast():
                    outputs = model(batch["pixel_values"])
                    terms = task.loss_terms(outputs, batch, labels)
                    loss = torch.stack(list(terms.values())).sum()
                accelerator.backward(loss)
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), task.max_grad_norm)
                optimizer.step()
            except torch.OutOfMemoryError as error:
                raise _out_of_memory(error) from error
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            logged = {"loss": loss, **{f"loss/{k}": v for k, v in terms.items()}, "grad_norm": grad_norm}
            for name, value in logged.items():
                window[name] = window.get(name, 0) + value.detach().float()
            window_steps += 1
            progress.update(1)
            last = step == steps
            if step % log_every == 0 or last:
                averages = _mean_across(accelerator, window, window_steps)
                images_per_second = window_steps * global_batch / (time.perf_counter() - window_start)
                row = {"kind": "train", "step": step, "epoch": step * global_batch / len(records)} | averages
                peak_lr = options.lr * optim.lr_factor(step - 1, warmup, steps)
                row |= {"lr": peak_lr, "images_per_second": images_per_second}
                if main:
                    record.add(row)
                progress.set_postfix(loss=f"{averages['loss']:.4g}", img_s=f"{images_per_second:.1f}")
                window, window_steps, window_start = {}, 0, time.perf_counter()
            if val_set is not None and (step % val_every == 0 or last):
                summary = validate(accelerator, model, task, val_set, labels, options.batch_size)
                if main:
                    record.add({"kind": "val", "step": step} | summary)
                    tqdm.write(
                        f"step {step} validation: "
                        + ", ".join(f"{k} {v:.4g}" for k, v in summary.items() if "/" not in k)
                    )
            requested = stop_request.requested or (stop is not None and stop(step))
            if world > 1:
                flag = torch.tensor([float(requested)], device=accelerator.device)
                requested = bool(accelerator.reduce(flag, "sum").item() > 0)
            if step % options.save_every == 0 or last or requested:
                save(step)
            if requested and not last:
                progress.close()
                if main:
                    tqdm.write(f"Stopped at step {step}; continue with --resume {out}")
                return TrainingRun(step, out / f"checkpoint-{step}", accelerator.unwrap_model(model))
    progress.close()
    if main:
        final = checkpoints.save_final(out, accelerator.unwrap_model(model), config, settings)
        record.plot()
        log.info("Done: %s", final)
    accelerator.wait_for_everyone()
    return TrainingRun(step, out / checkpoints.FINAL_NAME, accelerator.unwrap_model(model))


def _validation_set(
    task: TrainingTask,
    options: TrainOptions,
    settings: ProcessorSettings,
    labels,
    output_size: tuple[int, int],
) -> TaskSamples | None:
    if options.val is None:
        return None
    records, val_labels = task.read(options.val)
    if val_labels is not None and len(getattr(val_labels, "names", val_labels)) != len(
        getattr(labels, "names", labels)
    ):
        raise TrainingError(f"--val {options.val}: its labels differ in number from the training data's")
    return task.samples(records, settings, labels, options.seed, options.sigma, output_size=output_size)


def validate(
    accelerator: Accelerator, model, task: TrainingTask, samples: TaskSamples, labels, batch_size: int
) -> dict[str, float]:
    """The task's metrics and recipe loss on the validation set, shared across processes."""
    module = accelerator.unwrap_model(model)
    module.eval()
    metric = task.metric(samples.settings, labels)
    sums = metric.zeros(accelerator.device)
    loss = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    keys = [
        (index, None) for index in range(accelerator.process_index, len(samples), accelerator.num_processes)
    ]
    loader = DataLoader(samples, batch_size=batch_size, sampler=keys)
    with torch.no_grad():
        for batch in loader:
            batch = _device_batch(batch, accelerator.device)
            with accelerator.autocast():
                outputs = module(batch["pixel_values"])
                terms = task.loss_terms(outputs, batch, labels)
            count = len(batch["pixel_values"])
            loss += torch.stack(
                [
                    torch.stack(list(terms.values())).sum().double() * count,
                    torch.tensor(count, device=loss.device, dtype=torch.float64),
                ]
            )
            metric.update(sums, outputs, batch)
    module.train()
    sums, loss = accelerator.reduce(sums, "sum"), accelerator.reduce(loss, "sum")
    return {"loss": float(loss[0] / loss[1].clamp(min=1))} | metric.summary(sums.cpu())


def _mean_across(accelerator: Accelerator, window: dict[str, torch.Tensor], steps: int) -> dict[str, float]:
    """Each logged value's mean over the window's steps and over the processes."""
    names = sorted(window)
    values = torch.stack([window[name] / steps for name in names]).double()
    values = accelerator.reduce(values, "mean")
    return dict(zip(names, values.tolist(), strict=True))


def _resume(folder: Path, run: dict[str, Any], optimizer, scheduler) -> int:
    """Load the optimizer and schedule of `folder`; the step to continue from."""
    previous = checkpoints.read_trainer_state(folder)
    for name in FIXED_ON_RESUME:
        if previous.get(name) != run[name]:
            raise TrainingError(
                f"--resume {folder}: it was trained with {name}={previous.get(name)!r}, this run has "
                f"{run[name]!r}; a resumed run keeps the same task, seed, global batch size (--batch-size x "
                "processes) and length"
            )
    state = checkpoints.read_training_state(folder)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    log.info("Resuming from %s at step %d.", folder, state["step"])
    return int(state["step"])


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {key: str(value) if isinstance(value, Path) else value for key, value in values.items()}
