"""Checkpoint loading: a Hub repo id, a local directory or a bare original file -> an eval-mode module.

The model is built on the meta device and each tensor is read once, straight into the requested dtype and
device, then assigned with one strict `load_state_dict`: no random init, no full-precision copy on the GPU.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import HfApi, constants, hf_hub_download, try_to_load_from_cache
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import httpx
from huggingface_hub.utils import tqdm as hub_tqdm
from torch import nn

from sapiens2 import settings
from sapiens2.errors import CheckpointDownloadError, CheckpointError, CheckpointNotFoundError, ConfigError
from sapiens2.models import hub_access, presets
from sapiens2.models.config import Sapiens2Config, load_config
from sapiens2.models.device import checkpoint_dtype, parse_dtype, resolve_device
from sapiens2.models.layers import rope_periods
from sapiens2.models.modeling import build_model
from sapiens2.models.weights import listed, read_state_dict, stored_float_dtype
from sapiens2.progress import Progress

CHECKPOINT_DIR_ENV = "SAPIENS2_CHECKPOINT_DIR"
# Sizes of files on the Hub change only with a new upload; a note that is off for ten minutes is harmless.
SIZES_REMEMBERED_SECONDS = 600.0
_sizes_lock = threading.Lock()
_remote_sizes: dict[tuple[str, str, str | None], tuple[dict[str, int] | None, float]] = {}
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
PROCESSOR_CONFIG_NAME = "preprocessor_config.json"

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """Local files of a checkpoint: its config.json (None for a bare original file) and weight files."""

    config_path: Path | None
    weight_paths: tuple[Path, ...]
    repo_id: str | None = None

    @property
    def label(self) -> str:
        """The repo id and the local folder, or the folder or file alone, for messages."""
        where = str(self.config_path.parent if self.config_path else self.weight_paths[0])
        return f"{self.repo_id} ({where})" if self.repo_id else where


def from_pretrained(
    source: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    revision: str | None = None,
    progress: Progress | None = None,
) -> nn.Module:
    """Load a Sapiens2 model in eval mode from a Hub repo id, a directory or an original .safetensors file.

    Defaults: CUDA when available, else the CPU; the checkpoint's own precision, as transformers'
    `from_pretrained` does (`dtype="auto"`: config.json's `dtype`, else the weights'; float32 for the official
    checkpoints). `Runtime`, the app and the command line choose a faster one (`models.device.choose_dtype`).
    `progress(fraction, text)` is called while files download and while weights load, each stage running
    its fraction from 0 to 1. On the CPU, weights are copied into memory (never memory-mapped), so the file
    may change on disk while in use; one that changes while it is being read is refused (CheckpointError).
    """
    target = resolve_device(device)
    checkpoint = resolve_checkpoint(source, revision=revision, progress=progress)
    config = _config(checkpoint)
    dtype = _precision(dtype, config, checkpoint)
    try:
        with torch.device("meta"):
            model = build_model(config)
    except ConfigError as error:
        raise ConfigError(f"{checkpoint.label}: {error}") from error
    state = read_state_dict(
        checkpoint.weight_paths,
        model.state_dict(),
        target,
        dtype,
        label=checkpoint.label,
        progress=progress,
        progress_name=checkpoint.repo_id or checkpoint.label,
    )
    for name in model.state_dict().keys() - state.keys():  # RoPE periods the files lack (weights.py)
        rope = model.get_submodule(name.removesuffix(".periods"))
        state[name] = rope_periods(rope.head_dim, rope.theta, target).to(dtype)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def _precision(
    asked: str | torch.dtype | None, config: Sapiens2Config, checkpoint: ResolvedCheckpoint
) -> torch.dtype:
    """`asked`, or for None and "auto" the checkpoint's own precision."""
    if isinstance(asked, torch.dtype):
        return asked
    if asked is None or asked == "auto":
        try:
            return checkpoint_dtype(config.dtype, stored_float_dtype(checkpoint.weight_paths))
        except ConfigError as error:
            raise ConfigError(f"{checkpoint.label}: {error}") from error
    return parse_dtype(asked)


def resolve_checkpoint(
    source: str | os.PathLike[str], revision: str | None = None, progress: Progress | None = None
) -> ResolvedCheckpoint:
    """Find (downloading if needed) the files of `source`.

    A repo id is looked up first in $SAPIENS2_CHECKPOINT_DIR/<repo id>/, then in the Hugging Face cache or on
    the Hub (HF_HUB_OFFLINE, HF_TOKEN and `revision` honoured), where an official repo without config.json
    is read from its original file; otherwise `source` is a directory holding config.json and
    model.safetensors (or a sharded index), or an original sapiens2_<size>_<task>.safetensors.
    """
    text = os.fspath(source)
    local = _env_repo_dir(text)
    if local is not None:
        return _resolve_directory(local, repo_id=text)
    path = Path(text).expanduser()
    if path.is_dir():
        return _resolve_directory(path)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise CheckpointError(f"{path}: expected a .safetensors file or a checkpoint directory")
        return ResolvedCheckpoint(None, (path,))
    if not _is_repo_id(text):
        raise CheckpointNotFoundError(f"{text}: no such file or directory")
    return _resolve_hub(text, revision, progress)


def load_model_config(source: str | os.PathLike[str], revision: str | None = None) -> Sapiens2Config:
    """The config of `source` without its weights: its config.json alone (fetched alone from the Hub), or
    the preset of a bare original file."""
    text = os.fspath(source)
    path = Path(text).expanduser()
    directory = _env_repo_dir(text) or (path if path.is_dir() else None)
    if directory is not None and (directory / CONFIG_NAME).is_file():
        return _config(ResolvedCheckpoint(directory / CONFIG_NAME, (), text))
    if directory is None and not path.exists() and _is_repo_id(text):
        return _config(ResolvedCheckpoint(_fetch(text, CONFIG_NAME, revision, None), (), text))
    return _config(resolve_checkpoint(source, revision))


def processor_config_dir(repo_id: str, revision: str | None = None) -> Path | None:
    """The folder holding `repo_id`'s preprocessor_config.json (fetched if needed), or None if it has none.

    Never raises: a repo without the file, or one that cannot be reached, uses the task's defaults.
    """
    local = _env_repo_dir(repo_id) if _is_repo_id(repo_id) else None
    if local is not None:
        return local if (local / PROCESSOR_CONFIG_NAME).is_file() else None
    path = Path(repo_id).expanduser()
    if path.is_dir() or path.is_file():
        folder = path if path.is_dir() else path.parent
        return folder if (folder / PROCESSOR_CONFIG_NAME).is_file() else None
    if not _is_repo_id(repo_id):
        return None
    try:
        return _fetch(repo_id, PROCESSOR_CONFIG_NAME, revision, None).parent
    except CheckpointError:
        return None


def is_here(repo_id: str, revision: str | None = None) -> bool:
    """Whether `repo_id` can be loaded without the Hub: in the checkpoint folder or the Hugging Face cache."""
    return _env_repo_dir(repo_id) is not None or _is_cached(repo_id, revision)


def checkpoint_download_size(repo_id: str, revision: str | None = None) -> int | None:
    """Bytes still to download for `repo_id`: 0 when local or cached, None when unknown (offline, no Hub)."""
    if is_here(repo_id, revision):
        return 0
    if hub_access.local_only():
        return None
    sizes = _hub_file_sizes(repo_id, revision)
    if sizes is None:
        return None
    original = presets.original_file_name(repo_id)
    if CONFIG_NAME not in sizes and original in sizes:
        wanted = [original]
    elif WEIGHTS_NAME in sizes:
        wanted = [CONFIG_NAME, WEIGHTS_NAME]
    else:
        wanted = [CONFIG_NAME, INDEX_NAME, *(name for name in sizes if _SHARD.fullmatch(name))]
    return sum(sizes.get(name, 0) for name in wanted if not _cached_file(repo_id, name, revision))


def _hub_file_sizes(repo_id: str, revision: str | None) -> dict[str, int] | None:
    """The repo's file sizes on the Hub, None when it cannot say. The app's model-size note asks on every
    change of a size menu, by anyone: one answer per repo and revision is kept for a while (a failure for
    less), and concurrent callers wait for the one request."""
    key = (constants.ENDPOINT, repo_id, revision)
    with _sizes_lock:
        known = _remote_sizes.get(key)
        if known is not None and time.monotonic() < known[1]:
            return known[0]
        try:
            info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
            sizes = {sibling.rfilename: sibling.size or 0 for sibling in info.siblings or []}
            keep = SIZES_REMEMBERED_SECONDS
        except (HfHubHTTPError, httpx.HTTPError, OSError, ValueError):
            sizes, keep = None, hub_access.REMEMBER_SECONDS
        _remote_sizes[key] = (sizes, time.monotonic() + keep)
        return sizes


def forget_remote_sizes() -> None:
    """Ask the Hub for file sizes again on the next call."""
    with _sizes_lock:
        _remote_sizes.clear()


def use_checkpoint_dir(directory: str | os.PathLike[str]) -> Path:
    """Look up repo ids in `directory`/<repo id>/ before the Hub from now on: the settings in force, with it
    as their checkpoint folder, installed."""
    path = Path(directory).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"the checkpoint folder {directory} does not exist or is not a folder")
    settings.install(settings.current().but(checkpoint_dir=str(path)))
    return path


def display_name(source: str | os.PathLike[str]) -> str:
    """A repo id as it is; a local folder or file by its own name only: messages show no server path."""
    text = os.fspath(source)
    return text if _is_repo_id(text) else Path(text).name or text


# ---- resolution -------------------------------------------------------------------------------------------


def _is_repo_id(text: str) -> bool:
    return bool(_REPO_ID.fullmatch(text)) and not text.endswith(".safetensors")


def _env_repo_dir(repo_id: str) -> Path | None:
    root = settings.current().checkpoint_dir
    if not root or not _is_repo_id(repo_id):
        return None
    directory = Path(root).expanduser() / repo_id
    return directory if directory.is_dir() else None


def offline_instructions(repo_id: str) -> str:
    """How to run `repo_id` without the Hub, in plain words: no brackets, server paths or markup, so that a
    web page shows it as written and it tells nothing about the server."""
    # Official repos hold their weights twice (model.safetensors and the original file), but for the 4K
    # backbone's, which transformers does not know: it holds its original file alone.
    original = presets.original_file_name(repo_id)
    variant = original is not None and presets.parse_checkpoint_name(original)[0] in presets.VARIANTS
    # Named one by one: a glob's star would be taken for Markdown emphasis on the page.
    files = (CONFIG_NAME, PROCESSOR_CONFIG_NAME, original if variant else WEIGHTS_NAME)
    weights = " ".join(f"--include {name}" for name in files)
    return (
        f"To run without the Hub, download it on a machine with internet access (hf download {repo_id} "
        f"{weights} --local-dir checkpoints/{repo_id}: the includes skip the second copy of the weights "
        f"the repo holds), copy the checkpoints folder here and start with "
        f"--checkpoint-dir checkpoints (or {CHECKPOINT_DIR_ENV}=checkpoints) and HF_HUB_OFFLINE=1."
    )


def _fill_hint(repo_id: str) -> str:
    looked = "It is not in the checkpoint folder either. " if settings.current().checkpoint_dir else ""
    return looked + offline_instructions(repo_id)


def _resolve_directory(directory: Path, repo_id: str | None = None) -> ResolvedCheckpoint:
    config = directory / CONFIG_NAME
    if not config.is_file():
        original = presets.original_file_name(repo_id) if repo_id else None
        if original and (directory / original).is_file():
            return ResolvedCheckpoint(None, (directory / original,), repo_id)
        raise CheckpointNotFoundError(f"{directory}: no {CONFIG_NAME}")
    if (directory / WEIGHTS_NAME).is_file():
        return ResolvedCheckpoint(config, (directory / WEIGHTS_NAME,), repo_id)
    if not (directory / INDEX_NAME).is_file():
        raise CheckpointNotFoundError(f"{directory}: no {WEIGHTS_NAME} (nor a sharded {INDEX_NAME})")
    shards = tuple(directory / name for name in _shard_names(directory / INDEX_NAME))
    missing = [shard.name for shard in shards if not shard.is_file()]
    if missing:
        raise CheckpointNotFoundError(f"{directory}: missing weight shards {listed(missing)}")
    return ResolvedCheckpoint(config, shards, repo_id)


def _shard_names(index: Path) -> list[str]:
    """The weight files named by a sharded checkpoint's index, in first-use order."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return list(dict.fromkeys(str(name) for name in weight_map.values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{index}: not a valid safetensors index ({error})") from error


def _resolve_hub(repo_id: str, revision: str | None, progress: Progress | None) -> ResolvedCheckpoint:
    """config.json and model.safetensors (or its shards); for an official repo without config.json, its
    original file (sapiens2_<size>_<task>.safetensors), configured by the built-in preset."""
    try:
        config = _fetch(repo_id, CONFIG_NAME, revision, progress)
    except CheckpointNotFoundError as no_config:
        original = presets.original_file_name(repo_id)
        if original is None:
            raise
        try:
            return ResolvedCheckpoint(None, (_fetch(repo_id, original, revision, progress),), repo_id)
        except CheckpointNotFoundError:
            raise no_config from None
    try:
        return ResolvedCheckpoint(config, (_fetch(repo_id, WEIGHTS_NAME, revision, progress),), repo_id)
    except CheckpointNotFoundError as single_file_error:
        try:
            index = _fetch(repo_id, INDEX_NAME, revision, progress)
        except CheckpointNotFoundError:
            raise single_file_error from None
    shards = tuple(_fetch(repo_id, name, revision, progress) for name in _shard_names(index))
    return ResolvedCheckpoint(config, shards, repo_id)


def _hub_cache_dir() -> str | None:
    """HF_HUB_CACHE or HF_HOME/hub as set now; None leaves huggingface_hub's default."""
    return settings.current().hub_cache_dir


def _fetch(repo_id: str, filename: str, revision: str | None, progress: Progress | None) -> Path:
    """One file of a Hub repo from the cache or the network, every failure as a CheckpointError."""
    at = f"{repo_id}@{revision}" if revision else repo_id
    try:
        return Path(
            hf_hub_download(
                repo_id,
                filename,
                revision=revision,
                cache_dir=_hub_cache_dir(),
                local_files_only=hub_access.local_only(),
                tqdm_class=_progress_bar(progress, f"{repo_id}/{filename}") if progress else None,
            )
        )
    except GatedRepoError as error:
        raise CheckpointError(
            f"{repo_id} is gated: accept its terms at https://huggingface.co/{repo_id} and provide a token "
            "with HF_TOKEN (or `hf auth login`)"
        ) from error
    except RepositoryNotFoundError as error:
        raise CheckpointNotFoundError(
            f"no Hub repo {repo_id} (or it is private and HF_TOKEN does not grant access). "
            + _fill_hint(repo_id)
        ) from error
    except RevisionNotFoundError as error:
        raise CheckpointNotFoundError(f"{repo_id} has no revision {revision!r}") from error
    except RemoteEntryNotFoundError as error:
        raise CheckpointNotFoundError(f"{at} has no file {filename}") from error
    except LocalEntryNotFoundError as error:
        if hub_access.offline():
            reason = "is not on this machine, and HF_HUB_OFFLINE=1 forbids downloading it"
        elif not hub_access.reachable():
            reason = "is not on this machine, and the Hugging Face Hub cannot be reached from it"
        else:
            hub_access.mark_unreachable()  # the next files fail at once instead of waiting on the network
            reason = "could not be downloaded (the connection failed) nor found in the Hugging Face cache"
        raise CheckpointNotFoundError(f"{at}: {filename} {reason}. {_fill_hint(repo_id)}") from error
    except HfHubHTTPError as error:
        status = error.response.status_code
        if status in (401, 403):
            raise CheckpointError(
                f"{repo_id}: access denied (HTTP {status}); set HF_TOKEN to a token that can read it"
            ) from error
        message = f"{at}: downloading {filename} failed (HTTP {status}): {error}"
        raise CheckpointDownloadError(message) from error
    except (httpx.HTTPError, OSError) as error:
        message = f"{at}: downloading {filename} failed: {error}. {_fill_hint(repo_id)}"
        raise CheckpointDownloadError(message) from error


def _progress_bar(progress: Progress, label: str) -> type[hub_tqdm]:
    """A tqdm class reporting each downloaded chunk to `progress`."""

    class ProgressBar(hub_tqdm):
        done = 0.0

        def update(self, n: float | None = 1) -> bool | None:
            self.done += n or 0
            if self.total:
                megabytes = f"{self.done / 1e6:.0f} of {self.total / 1e6:.0f} MB"
                progress(min(self.done / self.total, 1.0), f"downloading {label}: {megabytes}")
            return super().update(n)

    return ProgressBar


def _cached_file(repo_id: str, filename: str, revision: str | None) -> Path | None:
    found = try_to_load_from_cache(repo_id, filename, cache_dir=_hub_cache_dir(), revision=revision)
    return Path(found) if isinstance(found, str) else None


def _is_cached(repo_id: str, revision: str | None) -> bool:
    """Whether the config and every weight file of `repo_id` (or its original file) are in the Hugging Face
    cache."""
    if _cached_file(repo_id, CONFIG_NAME, revision) is None:
        original = presets.original_file_name(repo_id)
        return original is not None and _cached_file(repo_id, original, revision) is not None
    if _cached_file(repo_id, WEIGHTS_NAME, revision) is not None:
        return True
    index = _cached_file(repo_id, INDEX_NAME, revision)
    return index is not None and all(_cached_file(repo_id, n, revision) for n in _shard_names(index))


# ---- config and weights -----------------------------------------------------------------------------------


def _config(checkpoint: ResolvedCheckpoint) -> Sapiens2Config:
    try:
        if checkpoint.config_path is not None:
            return load_config(checkpoint.config_path)
        return Sapiens2Config.from_dict(presets.config_for_checkpoint_name(checkpoint.weight_paths[0]))
    except ConfigError as error:
        raise ConfigError(f"{checkpoint.label}: {error}") from error
