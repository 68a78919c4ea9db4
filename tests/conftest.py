"""Test tiers: CPU unit (default), compile-only (sm_90a on the CPU), GPU (skipped without CUDA)."""
import os

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    has_cuda = _has_cuda()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on the device machine")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


def pytest_configure(config):
    # Compile-only tests build Hopper kernels without a GPU.
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
