"""With SAPIENS2_WARM_HEAP=1 the app and the command line keep large freed memory warm for the next photo
(sapiens2.runtime.warm_heap); it is off by default.

Each check runs in a fresh interpreter: the setting is process-wide, and the test process keeps glibc's own.
"""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

# Page faults taken while writing a 96 MB map (24576 pages) after a few like it were allocated and freed (the
# first ones may still be placed anew: torch asks for aligned blocks, a little larger than the freed one).
CHILD = """
import resource, sys
import torch
from sapiens2.runtime.warm_heap import keep_freed_memory
if sys.argv[1] == "warm":
    assert keep_freed_memory()
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(96 << 20, dtype=torch.uint8).fill_(1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
for _ in range(3):
    faults()
print(faults())
"""


def _faults_of_a_later_map(mode: str, **env: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        capture_output=True, text=True, check=True,
        env={**{k: v for k, v in os.environ.items() if k != "SAPIENS2_WARM_HEAP"}, **env},
    )  # fmt: skip
    return int(result.stdout.split()[-1])


def test_a_large_map_freed_is_soon_reused_without_page_faults():
    assert _faults_of_a_later_map("fresh") > 12000  # the premise: glibc unmaps it, the next one faults again
    assert _faults_of_a_later_map("warm", SAPIENS2_WARM_HEAP="1") < 500


@pytest.mark.parametrize("setting", [None, "0", "yes"])
def test_it_is_off_unless_asked_for(setting):
    env = {} if setting is None else {"SAPIENS2_WARM_HEAP": setting}
    with pytest.raises(subprocess.CalledProcessError):  # keep_freed_memory says it changed nothing
        _faults_of_a_later_map("warm", **env)
