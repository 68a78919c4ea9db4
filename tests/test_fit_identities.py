"""Algebraic-identity backward rules (flash_attn_poly/fit/identities.py): CPU, fast."""
import numpy as np
import pytest

from flash_attn_poly.fit import identities as I
from flash_attn_poly.fit import runtime as rt
from flash_attn_poly.asm.programs import load_table

P = load_table()["programs"]
X = np.linspace(-12.0, 12.0, 4001)
BF16 = rt.all_inputs("bf16")
BF16 = BF16[np.isfinite(BF16)]

FORWARD = {"sigmoid": "sigmoid_d4", "tanh": "tanh_d4", "silu": "sigmoid_d3", "softcap": "softcap_c50"}


@pytest.mark.parametrize("rule", ["sigmoid", "tanh", "silu"])
def test_real_order_is_the_formula(rule):
    prog = P[FORWARD[rule]]
    v = rt.replay(prog, X, "real")
    assert np.allclose(I.apply(rule, prog, X, "real"), I.FORMULA[rule](v, X), rtol=0, atol=1e-15)


def test_softcap_real_order_is_one_minus_t_squared():
    prog = P["softcap_c50"]
    uc = np.clip(X, -prog["L_c"], prog["L_c"])
    t = uc - rt.replay(prog, uc, "real")
    assert np.allclose(I.apply("softcap", prog, X, "real"), 1.0 - t * t, rtol=0, atol=1e-15)


@pytest.mark.parametrize("rule,one_minus", [("sigmoid", False), ("tanh", True)])
def test_fused_is_one_rounding_of_exact_value(rule, one_minus):
    """fma.rn(-v, v, v) / fma.rn(-v, v, 1): v*v is exact in float64 for 16-bit v, so the
    fused result must be a single rounding of the exact expression."""
    prog = P[FORWARD[rule]]
    v = rt.replay(prog, BF16, "fused")
    exact = (1.0 if one_minus else v) - v * v
    assert np.array_equal(I.apply(rule, prog, BF16, "fused"), rt.round_to(exact, "bf16"))


@pytest.mark.parametrize("rule", ["sigmoid", "tanh", "silu", "softcap"])
def test_fused_differs_from_separate(rule):
    prog = P[FORWARD[rule]]
    f = I.apply(rule, prog, BF16, "fused")
    s = I.apply(rule, prog, BF16, "separate")
    assert np.all(np.isfinite(f)) and np.all(np.isfinite(s))
    assert 0 < int(np.sum(f != s)) < len(BF16)
    if rule != "silu":
        # last op is one fma: fused is the nearest value to the exact result of the same
        # inputs, so it is never further from it than the two-rounding separate order
        if rule == "softcap":
            uc = rt.pmin(rt.pmax(BF16, -prog["L_c"]), prog["L_c"])
            t = rt.round_to(uc - rt.replay(prog, uc, "fused"), "bf16")
            exact = 1.0 - t * t
        else:
            v = rt.replay(prog, BF16, "fused")
            exact = (v if rule == "sigmoid" else 1.0) - v * v
        assert np.all(np.abs(f - exact) <= np.abs(s - exact))


def test_silu_rule_is_the_silu_bwd_block_spec():
    """Same bits as tests/asm_reference's silu_bwd_bf16x2 expectation (seed B1/B4 rule) inside
    the program's clamp; beyond it the block's sigmoid is exactly 0 / 1 (asm/ptxgen.py
    odd with its tail), so the rule gives 0 / 1 there."""
    import asm_reference as R
    table = load_table()
    ref = R.expected_values("silu_bwd_bf16x2", table, [BF16])[0]
    ours = I.apply("silu", P["sigmoid_d3"], BF16, "fused")
    inside = np.abs(BF16) <= P["sigmoid_d3"]["L_c"]
    assert np.array_equal(rt.to_bits(ours[inside], "bf16"), rt.to_bits(ref[inside], "bf16"))
    assert np.array_equal(ref[~inside], (BF16[~inside] > 0).astype(np.float64))


# Bounds: a few times the forward program's own error (identities amplify by <= ~2-3x).
BOUNDS = {
    ("sigmoid", "sigmoid_d4"): 0.01, ("sigmoid", "sigmoid_d3"): 0.012,
    ("tanh", "tanh_d4"): 0.04, ("silu", "sigmoid_d3"): 0.06, ("silu", "sigmoid_d4"): 0.04,
    ("softcap", "softcap_c50"): 0.08, ("sigmoid", "sigmoid_d4_f16"): 0.01,
    ("tanh", "tanh_d4_f16"): 0.03, ("silu", "sigmoid_d4_f16"): 0.05,
}


@pytest.mark.parametrize("rule,fwd", list(BOUNDS))
def test_errors_vs_exact_bounded(rule, fwd):
    e = I.errors_vs_exact(rule, P[fwd])
    d = P[fwd]["dtype"]
    vals = [e["real"], e[f"{d}_separate"], e[f"{d}_fused"]]
    assert all(np.isfinite(v) and v > 0 for v in vals), e
    assert e[f"{d}_fused"] < BOUNDS[(rule, fwd)], e
    assert e["real"] < BOUNDS[(rule, fwd)], e


def test_softcap_inside_clamp_reported():
    e = I.errors_vs_exact("softcap", P["softcap_c50"])
    assert 0 < e["bf16_fused_u_le_L_c"] <= e["bf16_fused"]


def test_gelu_has_no_identity_rule():
    assert "gelu" not in I.RULES   # documented: phi is not algebraic in Phi


def test_comparison_rows_and_markdown():
    rows = I.comparison({"programs": P})
    assert {r["rule"] for r in rows} == {"sigmoid", "tanh", "silu", "softcap"}
    for r in rows:
        assert np.isfinite(r["identity"]["bf16_fused"]) and np.isfinite(r["direct"]["bf16_fused"])
    md = I.markdown(rows, "cmd")
    assert md.count("\n| ") == len(rows) + 1
