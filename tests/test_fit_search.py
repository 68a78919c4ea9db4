"""Search gates, lattice refinement, sigmoid attention, softcap, and the committed table."""
import numpy as np
import pytest

from flash_attn_poly.fit import runtime as rt
from flash_attn_poly.fit import search as S
from flash_attn_poly.fit import sigattn, softcap
from flash_attn_poly.asm.programs import load_table
from flash_attn_poly.fit.programs import FUNCTIONS, searched
from flash_attn_poly.fit.targets import TARGETS

REQUIRED = ["sigmoid_d3", "tanh_d4", "tanh_d4_grad", "sigmoid_attn_n4096", "sigmoid_attn_n4096_grad",
            "softcap_c50", "softcap_c50_grad"] + [
    f"{fn}_d4{g}{d}" for fn in FUNCTIONS for g in ("", "_grad") for d in ("", "_f16")]


@pytest.fixture(scope="module")
def table():
    return load_table()


def test_required_names_present(table):
    missing = [n for n in REQUIRED if n not in table["programs"]]
    assert not missing, missing
    assert table["generated_by"].startswith("python -m flash_attn_poly.fit")


def test_stored_bits_values_and_errors_agree(table):
    for name, p in table["programs"].items():
        c = np.asarray(p["coeffs"], np.float64).ravel()
        bits = np.array([int(b, 16) for b in np.ravel(p["coeffs_bits"])])
        assert np.array_equal(rt.from_bits(bits, p["dtype"]), c), name
        assert np.array_equal(rt.round_to(c, p["dtype"]), c), name


@pytest.mark.parametrize("name", ["sigmoid_d3", "tanh_d4", "silu_d4", "gelu_d4_grad", "sigmoid_d4_f16"])
def test_stored_fused_error_replays(table, name):
    p = table["programs"][name]
    t = TARGETS[p["target"] + ("_grad" if p["derivative"] else "")]
    x = S.score_points()
    xr = rt.round_to(rt.round_to(x, "f32"), p["dtype"])
    err = np.abs(rt.replay(p, x, "fused") - t.f(xr)).max()
    assert err == pytest.approx(p["errors"][f"{p['dtype']}_fused"], rel=1e-12)


@pytest.mark.parametrize("name", ["sigmoid_d3", "tanh_d4"])
def test_regenerate_entry_matches_committed(table, name):
    """Re-run the search for two entries (full default grids, ~5 s each) and compare bits."""
    p = table["programs"][name]
    key = p["target"] + ("_grad" if p["derivative"] else "")
    new = searched(key, p["degree"], p["dtype"], p["fit"]["command"])
    assert new["coeffs_bits"] == p["coeffs_bits"]
    assert (new["L_i"], new["L_c"]) == (p["L_i"], p["L_c"])


def test_gates_reject_wide_clamp_and_bad_shape():
    cands = S.search("sigmoid", degrees=(3,), Li_grid=[3.0], Lc_grid=[3.0, 4.0, 4.25, 6.0])
    by_lc = {c.program["L_c"]: c for c in cands}
    assert by_lc[4.0].gates["clamp"] and not by_lc[4.25].gates["clamp"]   # L_c > L_i + 1
    assert not by_lc[6.0].ok
    # A deliberately non-monotone program must fail the monotonicity gate.
    x = np.linspace(-1, 12, 500)
    y = np.sin(x)
    assert not S._monotone_ok(x, y[None, :], +1, 2**-7)[0]
    assert S._monotone_ok(x, np.tanh(x)[None, :], +1, 2**-7)[0]


def test_refine_never_worse_and_stays_on_lattice():
    cands = S.search("tanh", degrees=(4,), Li_grid=[2.5, 3.0], Lc_grid=[2.5, 2.75])
    b0 = S.best(cands, 4)
    b1 = S.refine(b0, "tanh")
    assert b1.errors["bf16_fused"] <= b0.errors["bf16_fused"]
    assert b1.ok
    c = np.asarray(b1.program["coeffs"])
    assert np.array_equal(rt.round_to(c, "bf16"), c) and c[0] == 0.0


def test_ulp_step_moves_one_representable():
    assert S._ulp_step(1.0, 1, "bf16") == 1 + 2**-7
    assert S._ulp_step(1.0, -1, "bf16") == 1 - 2**-8
    assert S._ulp_step(-1.0, 1, "bf16") == -(1 - 2**-8)   # steps move toward +inf


def test_sigmoid_attn_pieces_meet_and_output_probability(table):
    p = table["programs"]["sigmoid_attn_n4096"]
    pr = p["params"]
    f, _ = sigattn.sigmoid_attn(pr["n"])
    # the pieces (relative least squares, not endpoint-pinned) nearly meet at the threshold:
    # q^(2^s) of both FP64 pieces at thr within 3% of sigma(thr - ln n)
    sh = pr["shift"] or [0.0, 0.0]
    k = 2 ** int(pr.get("squarings") or 0)
    ref = float(f(np.array(pr["thr"])))
    for r in (0, 1):
        val = np.polynomial.polynomial.polyval(pr["thr"] - sh[r], p["coeffs_fp64"][r]) ** k
        assert val == pytest.approx(ref, rel=0.03)
    y = rt.replay(p, np.linspace(-20, 20, 4001), "fused")
    assert np.all(np.isfinite(y)) and y.min() > -0.05 and y.max() < 1.05


def test_sigmoid_attn_grad_uses_forward_value(table):
    g = table["programs"]["sigmoid_attn_n4096_grad"]
    assert g["form"] == "piecewise2_factored" and len(g["params"]["a"]) == 2
    x = np.linspace(-5, 12, 301)
    fwd = rt.replay(table["programs"]["sigmoid_attn_n4096"], x, "fused")
    pr = g["params"]
    xc = np.clip(rt.round_to(x, "bf16"), pr["lo"], pr["hi"])
    m = xc >= pr["thr"]
    sh = pr["shift"] or [0.0, 0.0]
    u = rt.round_to(xc - np.where(m, sh[1], sh[0]), "bf16")
    gg = rt.fma(np.where(m, pr["b"][1], pr["b"][0]), u, np.where(m, pr["a"][1], pr["a"][0]), "bf16")
    if pr.get("g_squared"):
        gg = rt.mul(gg, gg, "bf16")
    assert np.array_equal(rt.replay(g, x, "fused"), rt.mul(fwd, gg, "bf16"))


def test_softcap_residual_chain(table):
    p = table["programs"]["softcap_c50"]
    x = np.linspace(-40, 40, 2001)
    out = rt.softcap_logit(p, x, "fused")
    assert np.abs(out - 50 * np.tanh(x / 50)).max() < 0.15      # bulk |x| <= 40: 0.11 logits
    assert np.array_equal(rt.round_to(out, "f32"), out)


def test_differentiated_tanh_grad_matches_forward(table):
    fwd, grad = table["programs"]["tanh_d4"], table["programs"]["tanh_d4_grad"]
    c = np.asarray(fwd["coeffs"])
    assert grad["degree"] == 3 and grad["form"] == "even"
    assert np.array_equal(grad["coeffs"], rt.round_to(np.arange(1, 5) * c[1:], "bf16"))
