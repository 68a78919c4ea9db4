"""Both launch paths (kernels/launch.py) build for sm_90a on the CPU, and the tvm-ffi
variant takes torch tensors + Python floats directly: called with CPU tensors it gets as
far as the device check of argument 0 (no CUDA here), which proves the signature."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")
torch = pytest.importorskip("torch")


def _rejects_cpu_tensor(fn, *args):
    with pytest.raises(Exception, match="device_type=cuda"):
        fn(*args)


@pytest.mark.compile
def test_attn_fwd_tvm_ffi_signature():
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from flash_attn_poly.kernels import attn_fwd_sm90 as A, score_stages as S

    cfg = A.AttnFwdConfig.default(S.make_stage("softmax", "native"))
    fn = A.compile_attn_fwd(cfg, tvm_ffi=True)
    q = torch.zeros(1, 256, 4, 128, dtype=torch.bfloat16)
    _rejects_cpu_tensor(fn, q, q, q, q, torch.zeros(1, 4, 256), 1.0, 1.0, 1.0, 1.0,
                       0, 0)   # window (left, right) sizes: Python ints for Int32


@pytest.mark.compile
def test_attn_bwd_tvm_ffi_signature():
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from flash_attn_poly.kernels import attn_bwd_sm90 as K
    from flash_attn_poly.kernels.score_stages_bwd import bwd_side

    key = K.BwdKey("bf16", 128, True, bwd_side("softmax", "native"), K.BwdTile.for_head_dim(128))
    fn = K.compile_bwd(key, tvm_ffi=True)
    x = torch.zeros(1, 256, 4, 128, dtype=torch.bfloat16)
    st, acc = torch.zeros(1, 4, 256), torch.zeros(1, 256, 4, 128)
    _rejects_cpu_tensor(fn, x, x, x, x, st, st, acc, acc, acc, 1.0, 0.0, 0.0, 0, 0)   # + window sizes


@pytest.mark.compile
@pytest.mark.parametrize("tvm_ffi", [True, False])
def test_elementwise_both_paths_compile(tvm_ffi):
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from flash_attn_poly.kernels import elementwise as ew

    key = ew.ElementwiseKey("silu_fwd", "bf16", "native", "flat", ())
    fn = ew.get_compiled(key, tvm_ffi)
    if tvm_ffi:
        x = torch.zeros(4096, dtype=torch.bfloat16)
        _rejects_cpu_tensor(fn, x, x, x, x, x, 4096, 1, 1)


def test_launch_mode_env(monkeypatch):
    from flash_attn_poly.kernels import launch

    calls = []
    monkeypatch.setenv(launch.ENV, "dlpack")
    launch.run("k", lambda: calls.append("tvm"), lambda: calls.append("dl"))
    monkeypatch.setenv(launch.ENV, "tvm")
    launch.run("k", lambda: calls.append("tvm"), lambda: calls.append("dl"))
    monkeypatch.delenv(launch.ENV)

    def broken():
        raise RuntimeError("boom")
    launch.run("k2", broken, lambda: calls.append("dl"))     # auto: falls back, logged
    launch.run("k2", lambda: calls.append("tvm"), lambda: calls.append("dl"))  # sticky
    assert calls == ["dl", "tvm", "dl", "dl"]
    monkeypatch.setenv(launch.ENV, "tvm")
    with pytest.raises(RuntimeError):
        launch.run("k3", broken, lambda: None)
    monkeypatch.setenv(launch.ENV, "bogus")
    with pytest.raises(ValueError):
        launch.mode()
