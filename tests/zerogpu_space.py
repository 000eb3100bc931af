"""The app as a ZeroGPU Space runs it, on a machine without a GPU: `python tests/zerogpu_space.py APP-ARGS`.

The real `spaces` package does everything it does on a Space (emulated CUDA in the web process, the models
recorded and packed at launch, a worker forked per GPU call or reused while the GPU stays idle, arguments
and results pickled through its queues, Gradio's progress sent back from the worker). Only what needs a
real GPU is stood in for: the device API answers from 127.0.0.1 (`tests/test_zerogpu.py` serves it and sets
SPACES_ZERO_GPU and SPACES_ZERO_DEVICE_API_URL), and the two functions that touch CUDA in a worker,
`spaces.zero.torch.init` and `move`, are replaced below by ones that put the packed tensors in CPU memory
where the real `move` puts them on the GPU. `ZEROGPU_SPACE_CRASH_COMPILE=1` makes the start-up compile's
worker die of a segmentation fault.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import spaces  # noqa: F401 - first, as on a Space: it patches torch when SPACES_ZERO_GPU is set
import spaces.zero.torch as zero_torch
import torch
from spaces.zero.torch import patching


def init_without_gpu(nvidia_uuid: str) -> None:
    """Stands in for `spaces.zero.torch.init`, which makes the worker's CUDA context on the lent GPU."""


def move_to_cpu(callback=None) -> None:
    """Stands in for `spaces.zero.torch.move`: every tensor the web process moved to "cuda" gets its data
    back, read from spaces' packs (written at launch) into CPU memory instead of GPU memory."""
    for fake, original in patching.cuda_aliases.items():
        if original is not None:
            fake.data = original
    for pack in patching.tensor_packs:
        with open(pack.path(), "rb") as file:
            placed = [entry for batch in pack.batches for entry in batch] + list(pack.big_tensors)
            for meta, size, aligned_size in placed:
                data = bytearray(file.read(aligned_size))[:size]
                storage = torch.frombuffer(data, dtype=torch.uint8).untyped_storage()
                tensor = torch.empty(0, dtype=meta.dtype).set_(storage, 0, meta.shape, meta.stride())
                for fake in pack.fakes[meta]:
                    fake.data = tensor
                if callback is not None:
                    callback(size)


zero_torch.init = init_without_gpu
zero_torch.move = move_to_cpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import app  # noqa: E402


def crash(*args, **kwargs) -> None:
    """The whole process ends as a segmentation fault ends it: no exception, no cleanup."""
    os.kill(os.getpid(), signal.SIGSEGV)


if __name__ == "__main__":
    if os.environ.get("ZEROGPU_SPACE_CRASH_COMPILE") == "1":
        from sapiens2.models import aot

        aot.compile_models = crash  # in the start-up's GPU worker, which inherits it
    app.main(sys.argv[1:])
