"""CPU tier: the two-region FP16 softcap candidate (flash_attn_poly/fit/softcap_tail.py)
against the deployed FP16 D5 residual program, in attention-output units."""
import numpy as np
import pytest

from flash_attn_poly.asm import programs
from flash_attn_poly.fit import runtime as rt, softcap, softcap_tail as T


@pytest.fixture(scope="module")
def setup():
    return programs.entry("softcap_c50_f16"), softcap.AttnScore(T.C)


def test_tail_fit_error_in_logits():
    m, coef = T.fit_tail(1.0, 3.0, 5)
    assert coef.dtype == np.float64 and len(coef) == 6
    x = np.linspace(T.C * 1.0, T.C * 3.0, 20001)
    res = programs.entry("softcap_c50_f16")
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


def test_table_entries_are_what_the_generator_makes():
    """The committed softcap_c50_f16_tail pair equals softcap_tail.entries() of the table (the
    command in its fit record regenerates it)."""
    table = programs.load_table()
    made = T.entries(table)
    for name, entry in made.items():
        got = table["programs"][name]
        for k in ("form", "dtype", "L_c", "coeffs", "coeffs_bits"):
            assert got[k] == entry[k], (name, k)
        assert got["params"]["thr"] == entry["params"]["thr"] and got["params"]["shift"] == entry["params"]["shift"]


def test_region_threshold_is_the_blocks_f16_test():
    """runtime.region_threshold_f32: for every FP32 u within 4096 ulps of the threshold,
    |u| >= t exactly when cvt.rn.f16(|u|) >= thr (the block's region test)."""
    prog = programs.entry(T.TAIL_NAME)
    t = rt.region_threshold_f32(prog)
    base = np.float32(t).view(np.uint32)
    u = (base + np.arange(-4096, 4097, dtype=np.int64)).astype(np.uint32).view(np.float32).astype(np.float64)
    assert np.array_equal(u >= t, rt.round_to(u, "f16") >= prog["params"]["thr"])
    assert rt.round_to(np.array([t]), "f16")[0] == prog["params"]["thr"]


def test_tail_program_attention_error_and_logits(setup):
    """The table's two-region program, in the fused order the block runs (bit-exact against
    the emulator in test_asm_emulator), with the kernel's FP32 combine: attention-output error
    1.13x / 1.59x native at raw score std 10 / 20 (the residual alone: 1.13x / 2.94x); the
    f16 rounding of |u| before the tail's centring costs that much against the CPU model's
    FP32 centring (1.37x).  Logits within 0.026 of c tanh(x/c) up to the clamp (150)."""
    res, score = setup
    prog = programs.entry(T.TAIL_NAME)
    r = T.attn_ratios(lambda x: rt.softcap_logit(prog, x, "fused"), score)
    assert r[0] < 1.2 and r[1] < 1.7, r
    x = np.linspace(-150, 150, 300001)
    logit = rt.softcap_logit(prog, x, "fused")
    assert np.abs(logit - T.C * np.tanh(x / T.C)).max() < 0.03
    assert np.array_equal(rt.softcap_logit(prog, -x, "fused"), -logit)


def test_tail_grad_program_is_the_derivative():
    """d logit/dx of the pair: the residual's 1 - rho'(a) below |u| = 1 and the executed eps
    differentiated above: within 0.0035 of 1 - tanh^2(u) on |u| <= 3 (the residual grad
    program alone, frozen at its clamp 2: 0.037)."""
    g = programs.entry(T.TAIL_NAME + "_grad")
    u = np.linspace(-3, 3, 60001)
    assert np.abs(rt.replay(g, u, "fused") - (1 - np.tanh(u) ** 2)).max() < 0.0035
