"""flash-attn-4's Blackwell kernels with our score functions, built for sm_100a on the CPU
(tests/fa4_builds.py; the table: bench/results/sm100_sass.md).  Three builds (forward and
backward each, ~20-30 s per build on a small CPU, cached in /tmp): native softcap (the score
sites), poly softcap and poly sigmoid at the seed's shape class.  Skipped without flash-attn-4
(pip install 'flash-attn-poly[fa4]')."""
import importlib.util

import pytest

pytestmark = pytest.mark.compile

if importlib.util.find_spec("flash_attn") is None or importlib.util.find_spec("flash_attn.cute") is None:
    pytest.skip("flash-attn-4 is not installed (pip install 'flash-attn-poly[fa4]')", allow_module_level=True)

import fa4_builds as fb  # noqa: E402


def _per(name, part):
    return fb.per_score(name)[part]


@pytest.mark.parametrize("part", ["fwd", "bwd"])
def test_tcgen05_mma_in_every_build(part):
    for name in ("softcap_native", "softcap_poly", "sigmoid_poly"):
        c = fb.counts(fb.sass(name)[part])
        assert c["UTCMMA (tcgen05.mma)"] > 0, (name, part, c)


def test_poly_softcap_mufu_per_score():
    """The program takes the tanh off MUFU: what stays is FA4's exp2 (MUFU.EX2 on most of its
    columns in the forward, one per recomputed P in the backward) and a few per-row ops."""
    fwd, bwd = _per("softcap_poly", "fwd"), _per("softcap_poly", "bwd")
    assert fwd["MUFU.TANH"] == 0 and bwd["MUFU.TANH"] == 0
    assert round(fwd["MUFU"], 2) == 0.89, fwd
    assert round(bwd["MUFU"], 2) == 1.00, bwd
    # the program runs: its packed Horner chain (HFMA2) on every score pair
    for part in ("fwd", "bwd"):
        assert _per("softcap_poly", part)["HFMA2"] >= _per("softcap_native", part)["HFMA2"] + 2.0


@pytest.mark.parametrize("part", ["fwd", "bwd"])
def test_goal_poly_softcap_at_most_half_of_natives_mufu(part):
    poly, native = _per("softcap_poly", part)["MUFU"], _per("softcap_native", part)["MUFU"]
    assert native >= 1.85, native         # tanh + exp2 per score (FA4 emulates a few exp2)
    assert poly <= 0.5 * native, (poly, native)


def test_poly_sigmoid_mufu_per_score():
    """Through FA4 sigmoid costs ln sigma (MUFU.LG2) and FA4's exp2; the program removes the
    tanh that native sigma takes (native: 2.89 forward, 3.00 backward per score)."""
    fwd, bwd = _per("sigmoid_poly", "fwd"), _per("sigmoid_poly", "bwd")
    assert fwd["MUFU.TANH"] == 0 and bwd["MUFU.TANH"] == 0
    assert round(fwd["MUFU"], 2) == 1.89, fwd
    assert round(bwd["MUFU"], 2) == 2.00, bwd
