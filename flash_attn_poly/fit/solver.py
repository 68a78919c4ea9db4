"""FP64 dual-endpoint-constrained least squares.

On [a, b] in the variable u (u = t for the half-domain fits, u = x - shift for
sigmoid-attention regions) the polynomial is written as

    p = f(a) + (f(b) - f(a)) * s + sum_{k=2..D} beta_k * (s^k - s),   s = (u - ua)/(ub - ua)

so p(a) = f(a) and p(b) = f(b) hold by construction and only the beta_k, whose
basis terms vanish at both ends, are solved for.  With a = 0 this is the seed's
basis x^k - L^(k-1) x with c0 = f(0) and c1 = (f(L) - f(0))/L.  Working in the
normalised s keeps the least-squares matrix well conditioned (all columns O(1)).
"""
from __future__ import annotations

import numpy as np
from numpy.polynomial import Polynomial

N_NODES = 2000


def chebyshev_nodes(a: float, b: float, n: int = N_NODES) -> np.ndarray:
    """Chebyshev points of the first kind mapped to [a, b] (denser at both ends,
    where the endpoint constraints pin the error to zero)."""
    j = np.arange(n)
    return a + (b - a) * 0.5 * (1.0 - np.cos(np.pi * (j + 0.5) / n))


def fit_constrained(f, a: float, b: float, degree: int, shift: float = 0.0,
                    n_nodes: int = N_NODES, weight=None) -> np.ndarray:
    """Monomial coefficients c_0..c_D in u = x - shift of the constrained fit of f on [a, b].

    weight(x) > 0 scales each residual (e.g. 1/f for relative error)."""
    if degree < 2:
        raise ValueError("need degree >= 2 for a free basis term")
    x = chebyshev_nodes(a, b, n_nodes)
    fa, fb = float(f(np.array(a))), float(f(np.array(b)))
    s = (x - a) / (b - a)
    base = fa + (fb - fa) * s
    A = np.stack([s**k - s for k in range(2, degree + 1)], axis=1)
    r = f(x) - base
    if weight is not None:
        w = weight(x)
        A, r = A * w[:, None], r * w
    beta, *_ = np.linalg.lstsq(A, r, rcond=None)
    ps = Polynomial([fa, fb - fa]) + sum(
        bk * (Polynomial([0, 0] + [0] * (k - 2) + [1]) - Polynomial([0, 1]))
        for k, bk in zip(range(2, degree + 1), beta))
    ua, w_ = a - shift, b - a
    pu = ps(Polynomial([-ua / w_, 1.0 / w_]))  # substitute s = (u - ua)/(ub - ua)
    c = np.zeros(degree + 1)
    c[: len(pu.coef)] = pu.coef
    if a == shift:  # half-domain fit: c0 and c1 are exactly f(0) and the chord slope
        c[0] = fa
        c[1] = (fb - fa) / (b - a) - sum(beta[k - 2] / (b - a) for k in range(2, degree + 1))
        for k in range(2, degree + 1):
            c[k] = beta[k - 2] / (b - a) ** k
    return c


def fit_half(g, L: float, degree: int, n_nodes: int = N_NODES, weight=None) -> np.ndarray:
    """Fit the half-domain residual g on [0, L]; p(0) = g(0), p(L) = g(L)."""
    return fit_constrained(g, 0.0, L, degree, 0.0, n_nodes, weight)


def differentiate(coeffs) -> np.ndarray:
    """Coefficients of q' (d/dt of sum c_k t^k): the differentiated-polynomial backward."""
    c = np.asarray(coeffs, np.float64)
    return np.array([k * c[k] for k in range(1, len(c))])
