"""Fresh tensor memory is faulted in by the kernel before a checkpoint's bytes are read into it."""

import resource
import sys

import pytest
import torch

from sapiens2.models.fresh_memory import populate

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux's")
MB = 1024 * 1024


def _faults_while_writing(tensor: torch.Tensor) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensor.fill_(1)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_a_populated_tensor_takes_no_page_faults_when_written():
    # 64 MB is above glibc's largest mmap threshold, so each tensor is memory the process never touched.
    plain = torch.empty(64 * MB, dtype=torch.uint8)
    assert _faults_while_writing(plain) > 8000  # the premise: one fault per 4 KiB page, about 16384

    ready = torch.empty(64 * MB, dtype=torch.uint8)
    if not populate(ready):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    assert _faults_while_writing(ready) < 100


def test_populate_accepts_small_and_unaligned_tensors():
    storage = torch.zeros(3 * 4096 + 7, dtype=torch.uint8)
    assert populate(storage[5:4000])  # inside one page: nothing whole to populate
    assert populate(storage[1:])
    assert storage.sum() == 0  # populating never changes the bytes
