"""The meter the memory budgets of the reliability tests rely on."""

import json
import subprocess
import sys
from pathlib import Path

MIB = 2**20

NESTED_BLOCKS = """
import json
import numpy as np
from peak_memory import MIB, PeakMemory

with PeakMemory() as outer:
    held = np.ones(300 * MIB // 8)
    del held
    with PeakMemory() as inner:
        held = np.ones(50 * MIB // 8)
        del held
print(json.dumps({"outer": outer.growth, "inner": inner.growth}))
"""


def test_a_peak_inside_another_block_keeps_both_peaks():
    # A block opened inside another (a visitor's wait during a video) must not wipe the outer block's peak
    # when it resets the kernel's mark. The meter reads the whole process's memory, so the blocks run in a
    # fresh process of their own: in the test process, a thread of an earlier test freeing memory during
    # the inner block hid its 50 MiB.
    tests = Path(__file__).resolve().parent
    ran = subprocess.run(
        [sys.executable, "-c", NESTED_BLOCKS],
        cwd=tests,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    growth = json.loads(ran.stdout.strip().splitlines()[-1])
    assert growth["outer"] >= 290 * MIB and 40 * MIB <= growth["inner"] < 100 * MIB, growth
