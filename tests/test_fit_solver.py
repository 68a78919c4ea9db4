"""FP64 constrained least squares and parity transforms."""
import numpy as np
import pytest
from numpy.polynomial import polynomial as P

from flash_attn_poly.fit.solver import chebyshev_nodes, differentiate, fit_constrained, fit_half
from flash_attn_poly.fit.targets import TARGETS


@pytest.mark.parametrize("key", sorted(TARGETS))
@pytest.mark.parametrize("degree", [3, 4, 6])
def test_endpoints_hit_exactly(key, degree):
    g = TARGETS[key].g
    L = 3.75
    c = fit_half(g, L, degree)
    assert len(c) == degree + 1
    assert c[0] == g(np.array(0.0))                  # c0 fixed, not solved
    assert abs(P.polyval(L, c) - g(np.array(L))) < 1e-14
    if TARGETS[key].form != "even":
        assert c[0] == 0.0                            # odd / residual forms vanish at 0


def test_fit_beats_chord_and_converges_with_degree():
    g = TARGETS["tanh"].g
    t = np.linspace(0, 3, 3001)
    errs = [np.abs(P.polyval(t, fit_half(g, 3.0, d)) - g(t)).max() for d in (3, 4, 5, 6)]
    assert errs[-1] < errs[0] / 10
    assert all(b <= a * 1.01 for a, b in zip(errs, errs[1:]))


def test_parity_reconstruction_is_exact_identity():
    # sigma(-x) = 1 - sigma(x) holds for any coefficients: program odd about 1/2 by construction.
    from flash_attn_poly.fit import runtime as rt
    c = fit_half(TARGETS["sigmoid"].g, 5.0, 4)
    p = {"form": "odd", "dtype": "bf16", "L_c": 5.0, "offset": 0.5, "coeffs": list(c), "params": {}}
    x = np.linspace(0, 8, 513)
    assert np.allclose(rt.replay(p, x, "real") + rt.replay(p, -x, "real"), 1.0, atol=1e-15, rtol=0)


def test_shifted_interval_fit():
    f = np.exp
    c = fit_constrained(f, -2.0, 1.0, 3, shift=-0.5)
    assert abs(P.polyval(-1.5, c) - np.exp(-2.0)) < 1e-14
    assert abs(P.polyval(1.5, c) - np.exp(1.0)) < 1e-14


def test_nodes_and_derivative():
    x = chebyshev_nodes(0.0, 2.0)
    assert len(x) == 2000 and x.min() > 0 and x.max() < 2
    assert np.array_equal(differentiate([0.0, 1.0, 2.0, 3.0]), [1.0, 4.0, 9.0])
