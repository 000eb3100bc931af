import threading

import pytest
import torch
from torch import nn

from sapiens2.errors import ConfigError
from sapiens2.runtime.cache import ModelCache, budget_from_env, model_bytes


class CountingLoader:
    """Builds a real linear layer per repo id and counts the calls."""

    def __init__(self, features: int = 64, fail: set[str] | None = None):
        self.calls: list[str] = []
        self.features = features
        self.fail = fail or set()

    def __call__(self, repo_id, *, device, dtype, progress=None):
        self.calls.append(repo_id)
        if repo_id in self.fail:
            raise OSError(f"cannot read {repo_id}")
        return nn.Linear(self.features, self.features).to(device=device, dtype=dtype)


def make_cache(loader, budget, estimate=None):
    return ModelCache(
        loader, device=torch.device("cpu"), dtype=torch.float32, budget_bytes=budget, estimate=estimate
    )


def test_second_request_reuses_the_loaded_model():
    loader = CountingLoader()
    cache = make_cache(loader, budget=10**9)
    first = cache.get("a")
    assert cache.get("a") is first
    assert loader.calls == ["a"]
    assert cache.stats.loads == 1 and cache.stats.hits == 1


def test_budget_of_one_model_evicts_the_least_recently_used():
    loader = CountingLoader()
    one = model_bytes(nn.Linear(64, 64))
    cache = make_cache(loader, budget=one)
    cache.get("a")
    cache.get("b")
    assert cache.cached_ids() == ["b"]
    assert cache.stats.evictions == ["a"]
    cache.get("a")
    assert loader.calls == ["a", "b", "a"]


def test_recently_used_model_survives_eviction():
    loader = CountingLoader()
    one = model_bytes(nn.Linear(64, 64))
    cache = make_cache(loader, budget=2 * one)
    cache.get("a")
    cache.get("b")
    cache.get("a")
    cache.get("c")
    assert cache.cached_ids() == ["a", "c"]


def test_known_size_evicts_before_loading():
    one = model_bytes(nn.Linear(64, 64))
    held_during_load = []

    class RecordingLoader(CountingLoader):
        def __call__(self, repo_id, **kwargs):
            held_during_load.append(cache.cached_ids())
            return super().__call__(repo_id, **kwargs)

    cache = make_cache(RecordingLoader(), budget=one, estimate=lambda repo_id: one)
    cache.get("a")
    cache.get("b")
    assert held_during_load == [[], []]


def test_failed_load_is_not_cached_and_is_retried():
    loader = CountingLoader(fail={"bad"})
    cache = make_cache(loader, budget=10**9)
    with pytest.raises(OSError):
        cache.get("bad")
    assert "bad" not in cache
    loader.fail.clear()
    assert isinstance(cache.get("bad"), nn.Linear)
    assert loader.calls == ["bad", "bad"]


def test_concurrent_first_requests_load_once():
    loader = CountingLoader()
    cache = make_cache(loader, budget=10**9)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("a"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loader.calls == ["a"]
    assert all(r is results[0] for r in results)


def test_budget_from_env(monkeypatch):
    monkeypatch.setenv("SAPIENS2_CACHE_GB", "2")
    assert budget_from_env(torch.device("cpu")) == 2 * 1024**3
    monkeypatch.setenv("SAPIENS2_CACHE_GB", "lots")
    with pytest.raises(ConfigError, match="SAPIENS2_CACHE_GB"):
        budget_from_env(torch.device("cpu"))
