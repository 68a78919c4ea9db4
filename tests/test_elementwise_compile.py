"""Compile tier: every elementwise kernel builds for sm_90a on the CPU; SASS checks."""
import pytest

from flash_attn_poly.kernels import elementwise as ew
from flash_attn_poly.kernels import elementwise_ops as ops
from flash_attn_poly.kernels import sass

pytestmark = pytest.mark.compile

KEYS = [ew.ElementwiseKey(k, "bf16", ev) for k in ops.BF16_KINDS for ev in ("poly", "native")]
KEYS += [ew.ElementwiseKey(k, "bf16", "poly", "concat") for k in ("swiglu_fwd", "swiglu_bwd")]
KEYS += [ew.ElementwiseKey(f"{fn}_{d}", "f16") for fn in ops.SWEEP_FNS for d in ("fwd", "bwd")]


def _counts(key):
    import cutlass.cute as cute

    k = ew.ElementwiseKernel(key)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=False)
    compiled = sass.compile_sm90(k, *k.fake_args(), stream)
    return sass.count_opcodes(sass.disassemble(compiled.artifacts.CUBIN))


@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"{k.kind}-{k.dtype}-{k.evaluator}-{k.layout}")
def test_sass(key):
    c = _counts(key)
    assert c["LDG.E.128"] > 0 and c["STG.E.128"] > 0, c
    assert c["STL"] == 0 and c["LDL"] == 0, f"register spills: {c}"
    if key.evaluator == "poly":
        assert c["MUFU"] == 0, c
        fam = "HFMA2.BF16" if key.dtype == "bf16" else "HFMA2"
        assert c[fam] > 0, c
    else:
        assert c["MUFU.TANH"] > 0, c
