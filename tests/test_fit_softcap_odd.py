"""CPU tier: the odd_u2 softcap program (flash_attn_poly/fit/softcap_odd.py): its replay, its
fit against the table entry, and its attention-output error against the one-region program."""
import numpy as np
import pytest

from flash_attn_poly.asm import blocks, programs
from flash_attn_poly.fit import runtime as rt, softcap, softcap_odd as O

NAME = "softcap_c50_f16_odd"


@pytest.fixture(scope="module")
def table():
    return programs.load_table()


def test_entry_is_what_the_fit_makes(table):
    """The committed entry equals make() at its own stored L_c, coefficient count and floor
    (what `python -m flash_attn_poly.fit softcap-odd --write` selected)."""
    p = programs.entry(NAME, table)
    q = O.make(p["L_c"], len(p["coeffs"]), floor=p["params"]["floor"])
    assert q["coeffs_bits"] == p["coeffs_bits"] and q["form"] == "odd_u2"
    assert p["fit"]["command"].startswith("python -m flash_attn_poly.fit softcap-odd")


def test_replay_is_odd_and_fits_rho(table):
    p = programs.entry(NAME, table)
    u = np.linspace(0.0, p["L_c"], 40001)
    y = rt.replay(p, u, "fused")
    # RN is symmetric: the FP16 evaluation of -u is exactly minus that of u
    assert np.array_equal(rt.replay(p, -u, "fused"), -y)
    c = p["params"]["c"]
    err = c * np.abs(y - (u - np.tanh(u)))
    assert err.max() < 0.2, err.max()    # logits; measured 0.146 (the one-region odd-form program: 0.226)


def test_logit_chain(table):
    """softcap_logit: within 0.07 logits of c tanh(x/c) below |x| = 80, saturated at
    c (L - rho(L)) beyond the clamp, odd, never NaN on finite scores."""
    p = programs.entry(NAME, table)
    c, L = p["params"]["c"], p["L_c"]
    x = np.linspace(-400.0, 400.0, 80001)
    y = rt.softcap_logit(p, x, "fused")
    assert np.isfinite(y).all()
    inner = np.abs(x) < 80
    assert np.abs(y - c * np.tanh(x / c))[inner].max() < 0.07
    edge = rt.softcap_logit(p, np.array([c * L]), "fused")[0]
    assert np.all(np.abs(y[np.abs(x) >= c * L]) == edge)
    assert np.array_equal(rt.softcap_logit(p, -x, "fused"), -y)


def test_attention_error_not_worse_than_one_region(table):
    """Selection claim (softcap.AttnScore, all columns through the program, worst of raw score
    std 10 / 20): odd_u2 2.79x native, the one-region odd-form program 2.94x (2026-11-30)."""
    score = softcap.AttnScore()
    odd = score(programs.entry(NAME, table))
    one = score(programs.entry("softcap_c50_f16", table))
    assert odd <= one + 1e-9, (odd, one)
    # the table's value reproduces to FP32 matmul rounding: the scores come from torch's CPU matmul, whose
    # kernels differ between CPUs (7e-6 relative on CI's 2-core Xeon against the machine that wrote the
    # table); the programs compared here differ by ~5%
    stored = programs.entry(NAME, table)["errors"]["attn_rel_l2_vs_native"]
    assert abs(odd - stored) < 1e-4 * stored, (odd, stored)


def test_block_has_no_alu_ops(table):
    """The point of the form: FMA-pipe packed ops only besides the input pack."""
    blk = blocks.get_block("softcap_fwd_f16x2_odd", table)
    ops = [ln.split()[0] for ln in blk.lines]
    assert ops[0] == "cvt.rn.f16x2.f32"
    assert not {o for o in ops if o.startswith(("min", "max", "and", "lop3", "set"))}
    assert ops.count("fma.rn.f16x2") == len(programs.entry(NAME, table)["coeffs"]) - 1
