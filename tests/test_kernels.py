"""CPU kernels chosen by measurement: the faster path wins, the choice is kept for the process and in a file,
a read-only file costs nothing but the measurement, and a model's outputs do not depend on the path."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import randomize_constants, tiny_config

from sapiens2.models import kernels, layers
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.modeling import build_model

needs_onednn = pytest.mark.skipif(not layers._ONEDNN_LINEAR, reason="this torch has no oneDNN linear")


@pytest.fixture(autouse=True)
def fresh_choices():
    kernels.remember_in(None)
    kernels.forget()
    yield
    kernels.remember_in(None)
    kernels.forget()


class Work:
    """Work whose duration on each path comes from a fake clock: `cost[path]` ticks a run."""

    def __init__(self, cost: dict[str, int]) -> None:
        self.cost, self.now, self.runs = cost, 0, {path: 0 for path in cost}

    def clock(self) -> int:
        return self.now

    def run(self) -> None:
        path = kernels.active()
        self.runs[path] += 1
        self.now += self.cost[path]

    def candidates(self) -> dict:
        return dict.fromkeys(self.cost, self.run)


@pytest.mark.parametrize("faster", [kernels.ATEN, kernels.ONEDNN])
def test_the_faster_path_is_chosen_and_measured_once_per_process(faster):
    slower = kernels.ONEDNN if faster == kernels.ATEN else kernels.ATEN
    work = Work({faster: 1, slower: 5})
    assert kernels.choose("shape A", work.candidates(), clock=work.clock) == faster
    runs = dict(work.runs)
    assert runs[faster] == runs[slower] > 1  # warmed up, then timed in turns
    assert kernels.choose("shape A", work.candidates(), clock=work.clock) == faster
    assert work.runs == runs  # remembered: nothing runs again
    kernels.choose("shape B", work.candidates(), clock=work.clock)
    assert work.runs[faster] > runs[faster]  # another shape is measured on its own


def test_the_fastest_run_counts_not_a_slow_moment():
    # Run by run (the untimed first runs, then three timed turns): aten's first timed run is slowed by
    # another process, its others are faster than any of oneDNN's.
    costs = {kernels.ATEN: iter([9, 50, 3, 3]), kernels.ONEDNN: iter([9, 4, 4, 4])}
    work = Work(dict.fromkeys(costs, 0))
    work.run = lambda: setattr(work, "now", work.now + next(costs[kernels.active()]))
    assert kernels.fastest(work.candidates(), clock=work.clock) == kernels.ATEN


def test_choices_are_kept_in_a_file_and_read_back(tmp_path):
    path = tmp_path / "cache" / kernels.FILE_NAME
    kernels.remember_in(path)
    work = Work({kernels.ATEN: 7, kernels.ONEDNN: 2})
    assert kernels.choose("shape", work.candidates(), clock=work.clock) == kernels.ONEDNN
    saved = json.loads(path.read_text())
    assert list(saved.values()) == [kernels.ONEDNN]
    assert kernels.machine_key() in next(iter(saved))  # per CPU model, torch and thread count
    kernels.forget()  # a new process: only the file knows
    kernels.remember_in(path)
    again = Work({kernels.ATEN: 7, kernels.ONEDNN: 2})
    assert kernels.choose("shape", again.candidates(), clock=again.clock) == kernels.ONEDNN
    assert sum(again.runs.values()) == 0


def test_a_read_only_file_system_only_costs_the_measurement():
    kernels.remember_in("/proc/sapiens2-cache/" + kernels.FILE_NAME)  # nothing can be made in /proc
    work = Work({kernels.ATEN: 1, kernels.ONEDNN: 2})
    assert kernels.choose("shape", work.candidates(), clock=work.clock) == kernels.ATEN
    assert kernels.choose("shape", work.candidates(), clock=work.clock) == kernels.ATEN


def test_an_unwritable_or_broken_file_is_ignored(tmp_path):
    folder = tmp_path / "a file, not a folder"
    folder.write_text("")
    kernels.remember_in(folder / kernels.FILE_NAME)  # its folder cannot be made
    work = Work({kernels.ATEN: 1, kernels.ONEDNN: 2})
    assert kernels.choose("shape", work.candidates(), clock=work.clock) == kernels.ATEN
    broken = tmp_path / kernels.FILE_NAME
    broken.write_text("{not json")
    kernels.remember_in(broken)
    assert kernels.choose("other", work.candidates(), clock=work.clock) == kernels.ATEN
    assert json.loads(broken.read_text())  # rewritten whole


def _tiny_backbone(dtype: torch.dtype) -> torch.nn.Module:
    config = Sapiens2Config.from_dict(tiny_config("pretrain", image_size=(64, 48)))
    torch.manual_seed(0)
    model = build_model(config)
    randomize_constants(model, torch.Generator().manual_seed(0))
    return model.to(dtype).eval()


@needs_onednn
def test_a_forward_measures_once_per_shape_and_precision_and_both_paths_agree(monkeypatch):
    model = _tiny_backbone(torch.float32)
    measured = []
    real_fastest = kernels.fastest
    monkeypatch.setattr(
        kernels, "fastest", lambda candidates, **kw: measured.append(1) or real_fastest(candidates)
    )
    pixels = torch.randn(2, 3, 64, 48)
    with torch.inference_mode():
        chosen = model(pixels).last_hidden_state
        model(pixels)
        assert len(measured) == 1
        model(pixels[:1])
        assert len(measured) == 2  # another batch size is another GEMM shape
        outputs = {}
        for path in (kernels.ATEN, kernels.ONEDNN):
            monkeypatch.setattr(kernels, "choose", lambda key, candidates, path=path, **kw: path)
            outputs[path] = model(pixels).last_hidden_state
    for output in outputs.values():
        torch.testing.assert_close(output, chosen, rtol=1e-5, atol=1e-5)


def test_training_and_other_devices_take_no_measurement(monkeypatch):
    model = _tiny_backbone(torch.float32)
    monkeypatch.setattr(kernels, "fastest", lambda *a, **kw: pytest.fail("measured"))
    model(torch.randn(1, 3, 64, 48))  # gradients recorded: F.linear, nothing to choose
    with torch.inference_mode():
        model.to(torch.float16)(torch.randn(1, 3, 64, 48))  # a precision oneDNN is not asked for


def test_a_process_adds_what_only_it_measured_and_takes_the_files_choice(tmp_path):
    path = tmp_path / kernels.FILE_NAME
    kernels.remember_in(None)
    work = Work({kernels.ATEN: 1, kernels.ONEDNN: 2})
    assert kernels.choose("measured before the file", work.candidates(), clock=work.clock) == kernels.ATEN
    key = f"{kernels.machine_key()} | measured before the file"
    other = f"{kernels.machine_key()} | another process's"
    path.write_text(json.dumps({other: kernels.ONEDNN}))
    kernels.remember_in(path)  # another process (a Ray actor) reading the file computes as this one
    assert json.loads(path.read_text()) == {other: kernels.ONEDNN, key: kernels.ATEN}
    slower = Work({kernels.ATEN: 2, kernels.ONEDNN: 1})
    assert kernels.choose("another process's", slower.candidates(), clock=slower.clock) == kernels.ONEDNN
    assert sum(slower.runs.values()) == 0


def test_processes_measuring_the_same_work_at_once_all_take_the_first_ones_choice(tmp_path):
    # Two Ray actors measure the same model shape at the same time and find different paths faster; the
    # second to finish takes the first's choice, so both compute alike.
    path = tmp_path / kernels.FILE_NAME
    kernels.remember_in(path)
    key = f"{kernels.machine_key()} | shape"
    work = Work({kernels.ATEN: 1, kernels.ONEDNN: 2})
    measure = work.run

    def run_while_the_other_process_finishes() -> None:
        measure()
        if not path.exists():
            path.write_text(json.dumps({key: kernels.ONEDNN}))

    candidates = dict.fromkeys(work.cost, run_while_the_other_process_finishes)
    assert kernels.choose("shape", candidates, clock=work.clock) == kernels.ONEDNN  # its own timing: aten
    assert json.loads(path.read_text()) == {key: kernels.ONEDNN}
    assert kernels.choose("shape", work.candidates(), clock=work.clock) == kernels.ONEDNN


def test_a_file_system_without_locks_only_loses_the_lock(tmp_path, monkeypatch):
    fcntl = pytest.importorskip("fcntl")

    def no_locks(*_):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    path = tmp_path / kernels.FILE_NAME
    kernels.remember_in(path)
    work = Work({kernels.ATEN: 2, kernels.ONEDNN: 1})
    assert kernels.choose("shape", work.candidates(), clock=work.clock) == kernels.ONEDNN
    assert list(json.loads(path.read_text()).values()) == [kernels.ONEDNN]
