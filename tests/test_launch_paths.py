"""The one launch path (kernels/compile_cache.py): every kernel family's cached build is a
tvm-ffi function taking torch tensors and Python numbers.  Called with CPU tensors it gets as
far as the device check of argument 0 (no CUDA here), which proves the signature; the
backward pre/post builds are checked the same way in tests/test_attn_bwd_prepost_compile.py."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _rejects_cpu_tensor(fn, *args):
    with pytest.raises(Exception, match="device_type=cuda"):
        fn(*args)


@pytest.mark.compile
def test_attn_fwd_signature(fresh_cache):
    torch = pytest.importorskip("torch")
    import sass_catalogue as cat
    from flash_attn_poly.kernels import attn_fwd_sm90 as A

    fn = A._compiled(cat.plan_of(cat.builds()["softmax_native_d128_bf16"]).fwd)
    q = torch.zeros(1, 256, 4, 128, dtype=torch.bfloat16)
    # the call's own numbers (scale, softcap, sigmoid bias: FP64; the score function encodes its
    # FP32 kernel arguments on the device side), then the window (left, right) sizes and the
    # persistent grid's CTA count and the LPT sections' bytes as Int32
    _rejects_cpu_tensor(fn, q, q, q, q, torch.zeros(1, 4, 256), 0.125, 0.0, 0.0, 0, 0, 0, 32 << 20)


@pytest.mark.compile
def test_attn_bwd_signature(fresh_cache):
    torch = pytest.importorskip("torch")
    import sass_catalogue as cat
    from flash_attn_poly.kernels import attn_bwd_sm90 as K

    cfg = cat.plan_of(cat.builds()["softmax_native_d128_bf16"]).bwd
    assert cfg.head_loop   # the anchor shape's build: dK, dV in the inputs' dtype, then a dK scale
    fn = K._compiled(cfg)
    x = torch.zeros(1, 256, 4, 128, dtype=torch.bfloat16)
    st, acc = torch.zeros(1, 4, 256), torch.zeros(1, 256, 4, 128)
    # scale, softcap, bias (FP64), window sizes, dK scale
    _rejects_cpu_tensor(fn, x, x, x, x, st, st, acc, x, x, 0.125, 0.0, 0.0, 0, 0, 1.0)


@pytest.mark.compile
def test_elementwise_signature(fresh_cache):
    torch = pytest.importorskip("torch")
    from flash_attn_poly.kernels import elementwise as ew

    fn = ew.get_compiled(ew.ElementwiseKey("silu_fwd", "bf16", "native", "flat", ()))
    x = torch.zeros(4096, dtype=torch.bfloat16)
    _rejects_cpu_tensor(fn, x, x, x, x, x, 4096, 1, 1)


def _product_sources():
    for folder in ("kernels", "flash_attn_poly"):
        for path in sorted((ROOT / folder).glob("*.py")):
            yield path


def test_no_second_launch_path():
    """No product module calls from_dlpack or reads a launch-path switch: a kernel launch is a
    call of the compiled tvm-ffi function (a second path would need its own tests and drift)."""
    offenders = []
    for path in _product_sources():
        text = path.read_text()
        if "FLASH_ATTN_POLY_LAUNCH" in text:
            offenders.append(f"{path.name}: FLASH_ATTN_POLY_LAUNCH")
        for node in ast.walk(ast.parse(text)):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name == "from_dlpack" or (isinstance(node, ast.alias) and node.name == "from_dlpack"):
                offenders.append(f"{path.name}:{node.lineno}: from_dlpack")
    assert not offenders, offenders
    assert not (ROOT / "kernels" / "launch.py").exists()
