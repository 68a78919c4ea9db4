"""Compile-only tests of the Hopper attention forward: build for sm_90a on the CPU
(CUTE_DSL_ARCH=sm_90a, no GPU) and check the SASS of every mode x evaluator x D x causal.

What the SASS must show:
  * HGMMA present (QK^T and PV run on the tensor cores);
  * no local-memory traffic (STL/LDL = register spills);
  * MUFU per mode: softmax has EX2 and no TANH; softcap/native has TANH; softcap/poly has
    no TANH; sigmoid/poly has no MUFU but the 2 RCP of the prologue's integer divide.
The poly checks are xfail while the poly evaluators run their temporary MUFU stand-ins
(score_stages._cute_ops() is None until flash_attn_poly.asm.cute_ops lands).
"""
from __future__ import annotations

import functools
import os
import tempfile

import pytest

pytest.importorskip("cutlass")


def _counts(mode, evaluator, head_dim=128, causal=True, dtype="bf16"):
    return _counts_cached(mode, evaluator, head_dim, causal, dtype)


@functools.lru_cache(maxsize=None)
def _counts_cached(mode, evaluator, head_dim, causal, dtype):
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from flash_attn_poly.kernels import attn_fwd_sm90 as A, sass, score_stages as S

    cfg = A.AttnFwdConfig.default(S.make_stage(mode, evaluator), dtype, head_dim, causal)
    dump = tempfile.mkdtemp(prefix="fap_attn_")
    compiled = A.compile_attn_fwd(cfg, options=f"--keep-cubin --dump-dir={dump}")
    return sass.count_opcodes(sass.disassemble(compiled.artifacts.CUBIN))


def _poly_is_real():
    from flash_attn_poly.kernels import score_stages as S
    return S._cute_ops() is not None


COMBOS = [(m, e, d, c) for m, e in [("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
                                    ("sigmoid", "native"), ("sigmoid", "poly")]
          for d in (64, 128) for c in (True, False)]


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,head_dim,causal", COMBOS)
def test_compiles_with_hgmma_and_no_spills(mode, evaluator, head_dim, causal):
    n = _counts(mode, evaluator, head_dim, causal)
    assert n["HGMMA"] > 0
    if evaluator == "poly" and (n["STL"] or n["LDL"]):
        # known: the poly blocks spill a few words (softcap 4 B, sigmoid 76 B at D=128),
        # see docs/NOTES_attn_fwd.md "Open"
        pytest.xfail(f"poly evaluator spills: STL {n['STL']} LDL {n['LDL']}")
    assert n["STL"] == 0 and n["LDL"] == 0, f"register spills: {n}"


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "native"), ("sigmoid", "native")])
def test_native_mufu(mode, evaluator):
    n = _counts(mode, evaluator)
    if mode == "softmax":
        assert n["MUFU.EX2"] > 0 and n["MUFU.TANH"] == 0
    elif mode == "softcap":
        assert n["MUFU.TANH"] > 0 and n["MUFU.EX2"] > 0
    else:
        assert n["MUFU.TANH"] > 0 and n["MUFU.EX2"] == 0


@pytest.mark.compile
def test_softcap_poly_has_no_tanh():
    if not _poly_is_real():
        pytest.xfail("asm cute_ops not landed: poly runs the MUFU stand-in")
    n = _counts("softcap", "poly")
    assert n["MUFU.TANH"] == 0 and n["HFMA2.BF16"] > 0


@pytest.mark.compile
def test_sigmoid_poly_has_no_mufu():
    if not _poly_is_real():
        pytest.xfail("asm cute_ops not landed: poly runs the MUFU stand-in")
    n = _counts("sigmoid", "poly")
    # the only MUFU left are 2 RCP of the prologue's integer divide head // (H_q / H_kv)
    assert n["MUFU"] - n["MUFU.RCP"] == 0 and n["MUFU.RCP"] <= 2 and n["HFMA2.BF16"] > 0


@pytest.mark.compile
def test_fp16_and_d256_compile():
    for dtype, d in (("fp16", 128), ("bf16", 256)):
        n = _counts("softmax", "native", d, True, dtype)
        assert n["HGMMA"] > 0 and n["STL"] == 0
