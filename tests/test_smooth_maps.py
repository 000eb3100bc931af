"""The official pointmap demo's smoothing on the CPU (OpenCV, plane by plane) against the convolution it
replaces there (kept for other devices and dtypes), computed in float64 as the reference."""

import pytest
import torch

from sapiens2.vision.dense import smooth_maps


@pytest.mark.parametrize("shape", [(1, 3, 64, 48), (2, 3, 17, 2), (1, 1, 2, 5)])
def test_cpu_smoothing_matches_the_convolution(shape):
    maps = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3
    fast = smooth_maps(maps)
    reference = smooth_maps(maps.double())  # float64 takes the convolution
    assert fast.dtype == torch.float32 and fast.shape == maps.shape
    assert float((fast.double() - reference).abs().max()) < 1e-5
    assert not torch.equal(fast, maps)


def test_cpu_smoothing_leaves_its_input_alone_and_reads_strided_maps():
    maps = torch.randn(1, 3, 40, 30, generator=torch.Generator().manual_seed(1))
    before = maps.clone()
    window = maps[..., 5:35, 3:27]  # unpadded maps are a view like this
    assert torch.allclose(smooth_maps(window), smooth_maps(window.contiguous()), atol=0, rtol=0)
    assert torch.equal(maps, before)


def test_maps_too_small_to_mirror_are_refused():
    with pytest.raises(ValueError, match="too small"):
        smooth_maps(torch.zeros(1, 3, 1, 8))
