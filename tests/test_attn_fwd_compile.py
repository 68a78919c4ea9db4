"""Compile-only tests of the Hopper attention forward: build for sm_90a on the CPU
(CUTE_DSL_ARCH=sm_90a, no GPU) and check the SASS of every mode x evaluator x D x causal.

What the SASS must show:
  * HGMMA present (QK^T and PV run on the tensor cores);
  * no local-memory traffic (STL/LDL = register spills);
  * MUFU per mode: softmax has EX2 and no TANH; softcap/native has TANH; pure poly
    (poly_split (1, 1)): softcap has no TANH, sigmoid has no MUFU but the 2 RCP of the
    prologue's integer divide;
  * the default poly split (j, k) keeps MUFU.TANH by design: exactly (1 - j/k) of native's.
"""
from __future__ import annotations

import functools
import os
import tempfile

import pytest

pytest.importorskip("cutlass")


def _counts(mode, evaluator, head_dim=128, causal=True, dtype="bf16", split=None, **tuning):
    return _counts_cached(mode, evaluator, head_dim, causal, dtype, split, tuple(sorted(tuning.items())))


@functools.lru_cache(maxsize=None)
def _counts_cached(mode, evaluator, head_dim, causal, dtype, split, tuning):
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from flash_attn_poly.kernels import attn_fwd_sm90 as A, sass, score_stages as S

    stage = S.make_stage(mode, evaluator, **({"poly_split": split} if split else {}))
    cfg = A.AttnFwdConfig.default(stage, dtype, head_dim, causal, **dict(tuning))
    dump = tempfile.mkdtemp(prefix="fap_attn_")
    compiled = A.compile_attn_fwd(cfg, options=f"--keep-cubin --dump-dir={dump}")
    return sass.count_opcodes(sass.disassemble(compiled.artifacts.CUBIN))


COMBOS = [(m, e, d, c) for m, e in [("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
                                    ("sigmoid", "native"), ("sigmoid", "poly")]
          for d in (64, 128) for c in (True, False)]


@pytest.mark.compile
@pytest.mark.parametrize("mode,evaluator,head_dim,causal", COMBOS)
def test_compiles_with_hgmma_and_no_spills(mode, evaluator, head_dim, causal):
    n = _counts(mode, evaluator, head_dim, causal)
    assert n["HGMMA"] > 0
    if evaluator == "poly" and (n["STL"] or n["LDL"]):
        # known: pure-poly builds spill a few words (ptxas allocates against 168 registers);
        # the default splits do not (docs/NOTES_attn_fwd.md)
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
def test_softcap_pure_poly_has_no_tanh():
    n = _counts("softcap", "poly", split=(1, 1), overlap=False, pingpong=True)
    assert n["MUFU.TANH"] == 0 and n["HFMA2.BF16"] > 0


@pytest.mark.compile
def test_sigmoid_pure_poly_has_no_mufu():
    n = _counts("sigmoid", "poly", split=(1, 1), overlap=False, pingpong=True)
    # the only MUFU left are 2 RCP of the prologue's integer divide head // (H_q / H_kv)
    assert n["MUFU"] - n["MUFU.RCP"] == 0 and n["MUFU.RCP"] <= 2 and n["HFMA2.BF16"] > 0


@pytest.mark.compile
@pytest.mark.parametrize("mode", ["softcap", "sigmoid"])
def test_default_split_keeps_its_share_of_tanh(mode):
    """The default split sends (1 - j/k) of the pairs to MUFU.TANH: exactly that share of
    the native build's TANH count (same loop structure), and no spills."""
    from flash_attn_poly.kernels import attn_fwd_sm90 as A, score_stages as S

    st = S.make_stage(mode, "poly")
    j, k = st.poly_split
    cfg = A.AttnFwdConfig.default(st)
    n = _counts(mode, "poly")
    nat = _counts(mode, "native", overlap=cfg.overlap, pingpong=cfg.pingpong)
    assert 0 < j < k, "defaults are measured splits, not the pure paths"
    assert n["MUFU.TANH"] * k == nat["MUFU.TANH"] * (k - j), (n, nat)
    assert n["HFMA2.BF16"] > 0 and n["STL"] == 0 and n["LDL"] == 0


@pytest.mark.compile
def test_fp16_and_d256_compile():
    for dtype, d in (("fp16", 128), ("bf16", 256)):
        n = _counts("softmax", "native", d, True, dtype)
        assert n["HGMMA"] > 0 and n["STL"] == 0
