"""Rounding and replay semantics (flash_attn_poly/fit/runtime.py)."""
import numpy as np
import pytest

from flash_attn_poly.fit import runtime as rt

torch = pytest.importorskip("torch")


def _f32_samples(n=100_000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp(rng.uniform(-95, 95, n))
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.39e38, 1e-40, -1e-45, 1.0 + 2**-8, 1.0 + 3 * 2**-8]
    with np.errstate(over="ignore"):
        return np.concatenate([x, special]).astype(np.float32).astype(np.float64)


def test_bf16_rounding_matches_torch():
    x = _f32_samples()
    ours = rt.round_to(x, "bf16")
    ref = torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).double().numpy()
    assert np.array_equal(ours, ref, equal_nan=True)
    ok = ~np.isnan(ref)
    assert np.array_equal(np.signbit(ours[ok]), np.signbit(ref[ok]))


def test_f16_rounding_matches_numpy_and_torch():
    x = _f32_samples(seed=1) * 1e-30  # push many into f16 subnormal/overflow ranges too
    x = np.concatenate([x, _f32_samples(seed=2) / 1e35]).astype(np.float32).astype(np.float64)
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).astype(np.float64)
    assert np.array_equal(rt.round_to(x, "f16"), ref, equal_nan=True)
    t = torch.tensor(x, dtype=torch.float32).to(torch.float16).double().numpy()
    assert np.array_equal(rt.round_to(x, "f16"), t, equal_nan=True)


def test_ties_to_even_and_overflow():
    one_ulp = 2.0**-7
    assert rt.round_to(np.array([1 + one_ulp / 2]), "bf16")[0] == 1.0          # tie -> even
    assert rt.round_to(np.array([1 + 1.5 * one_ulp]), "bf16")[0] == 1 + 2 * one_ulp
    big = (2 - 2**-8) * 2.0**127                                                # half-way to 2^128
    assert np.isinf(rt.round_to(np.array([big]), "bf16")[0])


def test_fma_single_rounding_breaks_ties_with_sticky():
    # 1 + 2^-8 is a bf16 tie; a tiny positive addend must push it up, negative down.
    a, b = np.array([1.0]), np.array([1.0 + 2**-7])
    assert rt.fma(a, b, np.array([2.0**-60]), "bf16")[0] == 1 + 2**-7
    assert rt.fma(np.array([1.0]), np.array([1.0]), np.array([2.0**-8]), "bf16")[0] == 1.0
    assert rt.fma(np.array([1.0]), np.array([1.0]), np.array([2.0**-8 + 2.0**-40]), "bf16")[0] == 1 + 2**-7


def test_bits_roundtrip_all_bf16():
    x = rt.all_inputs("bf16")
    bits = rt.to_bits(x, "bf16")
    ok = ~np.isnan(x)
    assert np.array_equal(bits[ok], np.arange(1 << 16)[ok])


def _odd_program(offset=0.5, dtype="bf16"):
    c = rt.round_to(np.array([0.0, 0.2734375, -0.0400390625, 0.00244140625]), dtype)
    return {"form": "odd", "dtype": dtype, "degree": 3, "L_c": 4.5, "offset": offset,
            "coeffs": list(c), "coeffs_fp64": list(c), "params": {}}


def test_fused_and_separate_differ_but_both_on_lattice():
    p = _odd_program()
    x = rt.all_inputs("bf16")
    x = x[np.isfinite(x)]
    fu, se = rt.replay(p, x, "fused"), rt.replay(p, x, "separate")
    assert np.array_equal(rt.round_to(fu, "bf16"), fu)
    assert np.array_equal(rt.round_to(se, "bf16"), se)
    assert np.count_nonzero(fu != se) > 20  # one rounding per fma vs two (90 for this set)


def test_odd_form_symmetry_and_clamp():
    p = _odd_program(offset=0.0)
    x = np.linspace(0, 12, 1001)
    y, ym = rt.replay(p, x, "fused"), rt.replay(p, -x, "fused")
    assert np.array_equal(y, -ym)  # sign restore by xor is exact
    assert np.all(y[x >= 4.5] == rt.replay(p, np.array([4.5]), "fused")[0])


def test_fused_nan_follows_ptx_min_rule():
    # min.bf16x2(NaN, L_c) = L_c, so a NaN input yields the clamped value, not NaN.
    p = _odd_program(offset=0.0)
    y = rt.replay(p, np.array([np.nan, 4.5]), "fused")
    assert y[0] == y[1]


def test_residual_even_exact_tail():
    c = rt.round_to(np.array([0.0, -0.02, 0.31, -0.068, 0.0052]), "bf16")
    p = {"form": "residual_even", "dtype": "bf16", "degree": 4, "L_c": 5.0, "offset": 0.0,
         "coeffs": list(c), "params": {}}
    x = np.array([-7.0, -5.25, 5.25, 9.0])
    assert np.array_equal(rt.replay(p, x, "fused"), [0.0, 0.0, 5.25, 9.0])


def test_bad_order_rejected():
    with pytest.raises(ValueError):
        rt.replay(_odd_program(), np.zeros(3), "double")


def test_fit_write_keeps_entries_made_by_other_commands(tmp_path, monkeypatch):
    """`python -m flash_attn_poly.fit write` rebuilds what programs.build makes and keeps the
    entries other commands added (search --write, softcap-tail): the kernels' FP16 defaults
    are among those, so a rebuild must not drop them."""
    from flash_attn_poly.fit import __main__ as cli, programs as P
    monkeypatch.setattr(P, "build", lambda command, progress: {"version": 1, "programs": {"a": {"x": 1}}})
    monkeypatch.setattr(P, "read", lambda path=None: {"programs": {"a": {"x": 0}, "softcap_c50_f16": {"y": 2}}})
    out = tmp_path / "programs.json"
    cli.main(["write", "--out", str(out)])
    import json
    progs = json.loads(out.read_text())["programs"]
    assert progs == {"a": {"x": 1}, "softcap_c50_f16": {"y": 2}}
