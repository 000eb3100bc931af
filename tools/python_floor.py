"""Check that no Python file of the project needs a Python newer than ZeroGPU's 3.10 (vermin reads them)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON_FLOOR = "3.10"  # ZeroGPU runs 3.10.13 (README's front matter asks for it)
SOURCES = ("app.py", "sapiens2", "tests", "tools", "bench")
VERMIN_ARGUMENTS = (
    f"--target={PYTHON_FLOOR}-",  # at most 3.10: any feature of 3.11 or later fails the check
    "--violations",
    "--eval-annotations",  # annotations count, though `from __future__ import annotations` defers them
    "--no-tips",
    "--exclude",
    "long",  # torch.long, read by vermin as Python 2's long type: only 2.x is at stake there
)


def check(paths: Sequence[str | Path]) -> subprocess.CompletedProcess:
    """vermin's verdict on `paths`: return code 0 when nothing needs more than PYTHON_FLOOR."""
    # vermin has no `python -m vermin`: its console script's function, called from this Python.
    command = [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())", *VERMIN_ARGUMENTS]
    command += [str(path) for path in paths]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def main() -> int:
    done = check([ROOT / source for source in SOURCES])
    print(done.stdout + done.stderr, end="")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
