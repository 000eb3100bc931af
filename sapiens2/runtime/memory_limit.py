"""The memory this process may use: its cgroup's limit (as a Space's container has), else the machine's."""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def usable_memory_bytes(cgroup_root: Path | None = None, proc_cgroup: Path | None = None) -> int:
    """The smallest of the machine's physical memory and every memory limit set on this process's cgroup or
    its ancestors (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`); "max" or a huge value is no limit."""
    physical = physical_memory_bytes()
    limits = [limit for limit in cgroup_limits(cgroup_root, proc_cgroup) if limit < physical]
    return min([physical, *limits])


def physical_memory_bytes() -> int:
    """The machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cgroup_limits(cgroup_root: Path | None = None, proc_cgroup: Path | None = None) -> list[int]:
    """Every memory limit readable for this process's cgroups, in bytes (none when nothing is readable)."""
    cgroup_root = CGROUP_ROOT if cgroup_root is None else cgroup_root
    proc_cgroup = PROC_CGROUP if proc_cgroup is None else proc_cgroup
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    files: list[Path] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # cgroup v2: one hierarchy, mounted at the root or at "unified" beside v1
            files += [base / "memory.max" for base in _with_ancestors(cgroup_root, path)]
            files += [base / "memory.max" for base in _with_ancestors(cgroup_root / "unified", path)]
        elif "memory" in controllers.split(","):
            bases = _with_ancestors(cgroup_root / "memory", path)
            files += [base / "memory.limit_in_bytes" for base in bases]
    return [limit for limit in map(_read_limit, dict.fromkeys(files)) if limit is not None]


def _with_ancestors(mount: Path, path: str) -> list[Path]:
    """`path` under `mount` and each of its parents up to the mount itself: in a container the mount is often
    the container's own cgroup, so the path as the host names it does not exist there, but the root does."""
    parts = [part for part in path.strip().split("/") if part and part != ".."]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read_limit(file: Path) -> int | None:
    try:
        text = file.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():  # "max" (v2) means no limit
        return None
    return int(text)
