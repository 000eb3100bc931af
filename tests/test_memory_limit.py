"""The memory the process may use, read from fake cgroup trees (v1, v2, hybrid, containers), and the cache's
default budget that follows from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sapiens2.runtime import memory_limit
from sapiens2.runtime.cache import GIB, MEMORY_KEPT_FOR_WORK, budget_from_env, default_budget
from sapiens2.runtime.memory_limit import cgroup_limits, usable_memory_bytes

PHYSICAL = 64 * GIB
UNLIMITED_V1 = "9223372036854771712"


@pytest.fixture(autouse=True)
def machine_of_64_gib(monkeypatch):
    monkeypatch.setattr(memory_limit, "physical_memory_bytes", lambda: PHYSICAL)


def tree(root: Path, proc_lines: list[str], files: dict[str, str]) -> tuple[Path, Path]:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text + "\n")
    proc = root / "proc_self_cgroup"
    proc.write_text("\n".join(proc_lines) + "\n")
    return root / "sys_fs_cgroup", proc


def test_v1_limit_of_the_process_own_cgroup(tmp_path):
    root, proc = tree(
        tmp_path,
        ["5:cpu,cpuacct:/space", "4:memory:/spaces/one", "0::/"],
        {
            "sys_fs_cgroup/memory/memory.limit_in_bytes": UNLIMITED_V1,
            "sys_fs_cgroup/memory/spaces/memory.limit_in_bytes": UNLIMITED_V1,
            "sys_fs_cgroup/memory/spaces/one/memory.limit_in_bytes": str(16 * GIB),
            "sys_fs_cgroup/memory/spaces/other/memory.limit_in_bytes": str(2 * GIB),  # not ours
        },
    )
    assert usable_memory_bytes(root, proc) == 16 * GIB


def test_v2_max_means_no_limit_and_a_parent_limit_applies(tmp_path):
    root, proc = tree(
        tmp_path,
        ["0::/user.slice/app.scope"],
        {
            "sys_fs_cgroup/user.slice/app.scope/memory.max": "max",
            "sys_fs_cgroup/user.slice/memory.max": str(12 * GIB),
        },
    )
    assert usable_memory_bytes(root, proc) == 12 * GIB


def test_v2_limit_in_a_hybrid_layout(tmp_path):
    root, proc = tree(
        tmp_path,
        ["4:memory:/", "0::/box"],
        {
            "sys_fs_cgroup/memory/memory.limit_in_bytes": UNLIMITED_V1,
            "sys_fs_cgroup/unified/box/memory.max": str(8 * GIB),
        },
    )
    assert usable_memory_bytes(root, proc) == 8 * GIB


def test_a_container_sees_its_own_cgroup_at_the_mount_root(tmp_path):
    # Without a cgroup namespace the process's path is the host's, absent inside the container's mount.
    root, proc = tree(
        tmp_path,
        ["9:memory:/docker/0123abcd"],
        {"sys_fs_cgroup/memory/memory.limit_in_bytes": str(16 * 10**9)},
    )
    assert usable_memory_bytes(root, proc) == 16 * 10**9


@pytest.mark.parametrize("limit", ["max", UNLIMITED_V1, str(PHYSICAL * 2), "", "garbage"])
def test_no_limit_or_one_above_the_machine_is_the_physical_memory(tmp_path, limit):
    root, proc = tree(tmp_path, ["0::/a"], {"sys_fs_cgroup/a/memory.max": limit})
    assert usable_memory_bytes(root, proc) == PHYSICAL


def test_unreadable_cgroup_information_is_the_physical_memory(tmp_path):
    assert cgroup_limits(tmp_path / "none", tmp_path / "missing") == []
    assert usable_memory_bytes(tmp_path / "none", tmp_path / "missing") == PHYSICAL


def test_the_cpu_default_budget_leaves_room_for_the_work_beside_the_models(tmp_path, monkeypatch):
    monkeypatch.delenv("SAPIENS2_CACHE_GB", raising=False)
    cpu = torch.device("cpu")
    assert default_budget(cpu, 16 * GIB) == 16 * GIB - MEMORY_KEPT_FOR_WORK
    assert default_budget(cpu, 128 * GIB) == 128 * GIB - MEMORY_KEPT_FOR_WORK
    assert default_budget(cpu, 4 * GIB) == GIB  # a small machine keeps a quarter for models
    assert default_budget(torch.device("cuda"), 16 * GIB) == 16 * GIB  # a GPU's memory, not the RAM
    limit = {"sys_fs_cgroup/memory/space/memory.limit_in_bytes": str(16 * GIB)}
    root, proc = tree(tmp_path, ["4:memory:/space"], limit)
    monkeypatch.setattr(memory_limit, "CGROUP_ROOT", root)
    monkeypatch.setattr(memory_limit, "PROC_CGROUP", proc)
    assert budget_from_env(cpu) == 16 * GIB - MEMORY_KEPT_FOR_WORK
    monkeypatch.setenv("SAPIENS2_CACHE_GB", "3")
    assert budget_from_env(cpu) == 3 * GIB
