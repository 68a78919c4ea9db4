"""Test tiers: CPU unit (default), compile-only (sm_90a on the CPU), GPU (skipped without CUDA)."""
import os
import sys
from pathlib import Path

import pytest

# `python -m pytest` puts the repository root first on sys.path, where the top-level kernels/
# (installed as flash_attn_poly.kernels) shadows the `kernels` package that transformers >= 5.25
# imports at start-up; the tests use the installed package, so the root leaves sys.path.
_ROOT = str(Path(__file__).resolve().parent.parent)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _ROOT]


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _dry_run(item) -> bool:
    """FAP_TEST_BACKEND=reference and a test module that honours it (HONORS_TEST_BACKEND = True,
    tests/gpu_check.py): its GPU tests run on the CPU with the reference standing in for the
    kernels instead of being skipped."""
    mod = getattr(item, "module", None)
    return (os.environ.get("FAP_TEST_BACKEND", "").strip() == "reference"
            and getattr(mod, "HONORS_TEST_BACKEND", False))


def pytest_collection_modifyitems(config, items):
    has_cuda = _has_cuda()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on the device machine")
    for item in items:
        if "gpu" in item.keywords and not has_cuda and not _dry_run(item):
            item.add_marker(skip_gpu)


def pytest_configure(config):
    # Compile-only tests build Hopper kernels without a GPU.
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


@pytest.fixture(autouse=True)
def _no_cubin_left_behind(request):
    """cute.compile with --keep-cubin and no --dump-dir writes <kernel>.sm_90a.cubin into the
    working directory, the repository root under pytest (kernels.sass.compile_sm90 and
    tests/builds.py keep theirs in a temporary dump dir).  The test that leaves one fails here
    and the file is removed.  (A parallel pytest in the same checkout that leaks could be blamed
    on a test of this process: the file names the kernel.)"""
    dirs = {Path(request.config.rootpath), Path.cwd()}
    before = {p for d in dirs for p in d.glob("*.cubin")}
    yield
    new = sorted({p for d in dirs for p in d.glob("*.cubin")} - before)
    for p in new:
        p.unlink(missing_ok=True)
    if new:
        pytest.fail(f"left {len(new)} .cubin file(s) in {sorted(map(str, {p.parent for p in new}))} "
                    f"(a --keep-cubin compile without --dump-dir): {[p.name for p in new]}", pytrace=False)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """kernels/compile_cache.py on an empty directory (tmp_path, yielded) with nothing in
    memory, before and after the test."""
    from flash_attn_poly.kernels import compile_cache

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    compile_cache.clear_memory()
    yield tmp_path
    compile_cache.clear_memory()
