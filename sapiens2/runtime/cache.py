"""Least-recently-used cache of loaded models under a memory budget."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from sapiens2.models.device import release_cached_memory
from sapiens2.runtime.memory_limit import usable_memory_bytes
from sapiens2.settings import Settings, current

GIB = 1024**3
# Room for a 5b model in bf16 (about 10 GiB) plus the body-part model on a 24 GB GPU, with headroom
# for activations at 1024x768.
DEFAULT_CUDA_BUDGET_GIB = 16.0
# Elsewhere the models share the memory the process may use (its cgroup's limit, else the machine's) with
# what is not a model: the web server and the image decoders (about 1.5 GiB together) and the All-tasks
# run of a 12 MP photo (its pictures, maps and exports, about 3 GiB at its peak, measured in a 16 GB cgroup:
# docs/hosting.md). A quarter of the memory stays the floor on small machines.
MEMORY_KEPT_FOR_WORK = 6 * GIB

Loader = Callable[..., nn.Module]
log = logging.getLogger("sapiens2.models")


def model_bytes(model: nn.Module) -> int:
    """Bytes held by a model's parameters and buffers."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def budget_from_env(device: torch.device, settings: Settings | None = None) -> int:
    """The cache budget in bytes: SAPIENS2_CACHE_GB, else a default for the device type."""
    gigabytes = (settings or current()).cache_gb
    return default_budget(device) if gigabytes is None else int(gigabytes * GIB)


def default_budget(device: torch.device, usable: int | None = None) -> int:
    """16 GiB of a GPU's memory; elsewhere the memory the process may use (`usable`, default: its cgroup's
    limit or the machine's) less what serving and a 12 MP photo need beside the models."""
    if device.type == "cuda":
        return int(DEFAULT_CUDA_BUDGET_GIB * GIB)
    usable = usable_memory_bytes() if usable is None else usable
    budget = max(usable - MEMORY_KEPT_FOR_WORK, usable // 4)
    log.info("model cache: %.2f GiB of the %.2f GiB this process may use", budget / GIB, usable / GIB)
    return budget


@dataclass
class CacheStats:
    loads: int = 0
    hits: int = 0
    evictions: list[str] = field(default_factory=list)


class ModelCache:
    """Loads each model once and keeps the most recently used ones within `budget_bytes`.

    A model that fails to load is never cached, so the next request retries cleanly. The model being
    returned is never evicted by its own insertion, even when it alone exceeds the budget.
    """

    def __init__(
        self,
        loader: Loader,
        *,
        device: torch.device,
        dtype: torch.dtype,
        budget_bytes: int,
        estimate: Callable[[str], int | None] | None = None,
    ):
        self._loader = loader
        self._estimate = estimate
        self.device = device
        self.dtype = dtype
        self.budget_bytes = budget_bytes
        self._models: OrderedDict[str, tuple[nn.Module, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._kept: set[str] = set()
        self.stats = CacheStats()

    def __contains__(self, repo_id: str) -> bool:
        with self._lock:
            return repo_id in self._models

    @property
    def bytes_held(self) -> int:
        """Bytes of the models held now."""
        with self._lock:
            return sum(size for _, size in self._models.values())

    @property
    def kept(self) -> frozenset[str]:
        """The models `keep` was asked to keep."""
        with self._lock:
            return frozenset(self._kept)

    def keep(self, repo_id: str) -> None:
        """Never evict `repo_id` (a model loaded at start-up for good)."""
        with self._lock:
            self._kept.add(repo_id)

    def load_through(self, wrap: Callable[[Loader], Loader]) -> None:
        """Load models through `wrap(loader)` from now on."""
        self._loader = wrap(self._loader)

    def cached_ids(self) -> list[str]:
        """Repo ids currently held, least recently used first."""
        with self._lock:
            return list(self._models)

    def get(self, repo_id: str, progress: Callable[[float, str], None] | None = None) -> nn.Module:
        """The model for `repo_id`, loading it on first use; concurrent first uses load it once."""
        with self._lock:
            if repo_id in self._models:
                self._models.move_to_end(repo_id)
                self.stats.hits += 1
                return self._models[repo_id][0]
            key_lock = self._key_locks.setdefault(repo_id, threading.Lock())
        with key_lock:
            with self._lock:
                if repo_id in self._models:
                    self._models.move_to_end(repo_id)
                    self.stats.hits += 1
                    return self._models[repo_id][0]
            self._make_room(repo_id)
            start = time.perf_counter()
            model = self._loader(repo_id, device=self.device, dtype=self.dtype, progress=progress)
            size = model_bytes(model)
            log.info("loaded %s (%.2f GB) in %.1f s", repo_id, size / 1e9, time.perf_counter() - start)
            with self._lock:
                self._models[repo_id] = (model, size)
                self.stats.loads += 1
                self._evict_over_budget(keep=repo_id)
            return model

    def evict(self, repo_id: str) -> None:
        """Drop one model, if held."""
        with self._lock:
            if self._models.pop(repo_id, None) is not None:
                self.stats.evictions.append(repo_id)
        self._release_memory()

    def clear(self) -> None:
        with self._lock:
            self.stats.evictions.extend(self._models)
            self._models.clear()
        self._release_memory()

    def _make_room(self, repo_id: str) -> None:
        """Evict before loading when the new model's size is known, so two big models never coexist."""
        expected = self._estimate(repo_id) if self._estimate else None
        if not expected:
            return
        with self._lock:
            total = sum(size for _, size in self._models.values())
            for key in [key for key in self._models if key not in self._kept]:
                if total + expected <= self.budget_bytes:
                    break
                total -= self._models.pop(key)[1]
                self.stats.evictions.append(key)
        self._release_memory()

    def _evict_over_budget(self, keep: str) -> None:
        total = sum(size for _, size in self._models.values())
        for key in list(self._models):
            if total <= self.budget_bytes:
                break
            if key == keep or key in self._kept:
                continue
            total -= self._models.pop(key)[1]
            self.stats.evictions.append(key)
        self._release_memory()

    def _release_memory(self) -> None:
        release_cached_memory(self.device)
