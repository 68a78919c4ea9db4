"""CPU tier: the two-region FP16 softcap candidate (flash_attn_poly/fit/softcap_tail.py)
against the deployed FP16 D5 residual program, in attention-output units."""
import numpy as np
import pytest

from flash_attn_poly.asm import blocks
from flash_attn_poly.fit import runtime as rt, softcap, softcap_tail as T


@pytest.fixture(scope="module")
def setup():
    return blocks.program(blocks.load_table(), "softcap_c50_f16"), softcap.AttnScore(T.C)


def test_tail_fit_error_in_logits():
    m, coef = T.fit_tail(1.0, 3.0, 5)
    assert coef.dtype == np.float64 and len(coef) == 6
    x = np.linspace(T.C * 1.0, T.C * 3.0, 20001)
    res = blocks.program(blocks.load_table(), "softcap_c50_f16")
    err = np.abs(T.tail_logit(res, x, 1.0, 3.0, m, coef) - T.C * np.tanh(x / T.C))
    assert err.max() < 0.02          # measured 0.0118 (FP16 Horner, FP32 combine)
    # odd: the tail keeps the sign, below u0 the residual program is used as is
    assert np.array_equal(T.tail_logit(res, -x, 1.0, 3.0, m, coef), -T.tail_logit(res, x, 1.0, 3.0, m, coef))


def test_tail_form_beats_residual_at_score_std_20(setup):
    """Residual D5 alone: 1.13x / 2.94x native at raw score std 10 / 20 (the table entry's
    selection score); with the tail above |u| = 1 (D5 on [1, 3], clamp 150 logits):
    1.13x / 1.37x (2026-11-30)."""
    res, score = setup
    base = T.attn_ratios(lambda x: rt.softcap_logit(res, x, "fused"), score)
    m, coef = T.fit_tail(1.0, 3.0, 5)
    cand = T.attn_ratios(lambda x: T.tail_logit(res, x, 1.0, 3.0, m, coef), score)
    assert base[1] > 2.5 and cand[1] < 1.6, (base, cand)
    assert cand[0] < base[0] + 0.05, (base, cand)
