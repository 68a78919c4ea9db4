"""How low can Table 2's error go? Exact floors for one program form under the seed's protocol.

Table 2's protocol: coefficients cast to BF16, evaluated in real arithmetic at 20,001 uniform
points over [-L_c, L_c].  In real arithmetic every reconstruction (abs, sign restore, offset,
x/2) is exact and no point lies beyond the clamp, so a program's error is

    E(c) = max_t |q(t) - g(t)|,   q(t) = sum_{k in K} c_k t^k,   t in T = {|x| : x in the grid},

with g the target's half-domain residual and K = 0..D (form "even") or 1..D (c0 = 0: odd and
residual forms).  E is convex in c, which gives two floors that no fit of that form, degree
and clamp can go below, however it was constructed:

* ``lp_minimax``: the minimum over real coefficients (a linear program in c and E).
* ``lattice_min``: the minimum over coefficient vectors on the BF16 lattice, exact, by branch
  and bound.  A node fixes some coefficients; two linear programs give the interval the next
  coefficient can take while E <= the best value found so far (an LP over a subset of T: fewer
  constraints only widen the interval, so no lattice point is lost); every lattice value in it
  is a child.  The last coefficient is found by a ternary search over its lattice values inside
  its interval: E restricted to one coordinate is convex, hence unimodal along the sorted
  lattice values.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from . import runtime as rt

N_REAL = 20001
_LP_POINTS = 2500   # LP rows (x2): bounds stay valid on a subset, pruning stays tight


def half_points(L_c: float, n: int = N_REAL) -> np.ndarray:
    """t = |x| over the n uniform points on [-L_c, L_c] (duplicates removed)."""
    return np.unique(np.abs(np.linspace(-L_c, L_c, n)))


def design(t, first: int, degree: int) -> np.ndarray:
    return np.stack([t**k for k in range(first, degree + 1)], axis=1)


def max_err(X, g, c) -> np.ndarray:
    """E for one coefficient vector (shape (m,)) or many (shape (..., m))."""
    return np.abs(np.asarray(c) @ X.T - g).max(axis=-1)


def lp_minimax(X, g):
    """(E*, c*): minimax over real coefficients on the points of X."""
    n, m = X.shape
    A = np.block([[X, -np.ones((n, 1))], [-X, -np.ones((n, 1))]])
    r = linprog(np.r_[np.zeros(m), 1.0], A_ub=A, b_ub=np.concatenate([g, -g]),
                bounds=[(None, None)] * (m + 1), method="highs")
    if r.status != 0:
        raise RuntimeError(f"minimax LP failed: {r.message}")
    return float(r.fun), r.x[:m]


def _all_values(dtype: str) -> np.ndarray:
    """Every finite value of dtype, sorted (65,280 for BF16: cheap to hold)."""
    pos = np.asarray(rt.from_bits(np.arange(0, 0x7F80 if dtype == "bf16" else 0x7C00), dtype), float)
    return np.unique(np.concatenate([-pos, pos]))


def _interval(X, g, T, fixed, j):
    """[lo, hi] of coefficient j over {c : |Xc - g| <= T, c_i = fixed[i]}; None if empty."""
    n, m = X.shape
    free = [i for i in range(m) if i not in fixed]
    r = g - (X[:, list(fixed)] @ np.array(list(fixed.values())) if fixed else 0.0)
    Xf = X[:, free]
    if len(free) == 1:   # closed form: |r_i - c x_i| <= T for every i (an LP of one variable
        x = Xf[:, 0]     # is slow in HiGHS)
        if np.any(np.abs(r[x == 0]) > T):
            return None
        nz = x != 0
        a, b = (r[nz] - T) / x[nz], (r[nz] + T) / x[nz]
        lo, hi = np.minimum(a, b).max(), np.maximum(a, b).min()
        return (lo, hi) if lo <= hi else None
    A = np.vstack([Xf, -Xf])
    b = np.concatenate([r + T, T - r])
    c = np.zeros(len(free))
    c[free.index(j)] = 1.0
    lo = linprog(c, A_ub=A, b_ub=b, bounds=[(None, None)] * len(free), method="highs")
    if lo.status == 2:
        return None
    hi = linprog(-c, A_ub=A, b_ub=b, bounds=[(None, None)] * len(free), method="highs")
    if lo.status != 0 or hi.status != 0:
        raise RuntimeError(f"interval LP failed: {lo.message} / {hi.message}")
    return lo.fun, -hi.fun


def lattice_min(X, g, dtype="bf16", start=None, max_nodes=200_000):
    """Exact min of E over dtype-lattice coefficient vectors.

    start: lattice coefficient vectors to seed the incumbent (e.g. Sollya's and ours).
    Returns dict(err, coeffs, nodes, lp_floor)."""
    vals = _all_values(dtype)
    n, m = X.shape
    lp_floor, c_lp = lp_minimax(X, g)
    seeds = [rt.round_to(c_lp, dtype)] + [np.asarray(s, float) for s in (start or [])]
    best_c = min(seeds, key=lambda c: float(max_err(X, g, c)))
    best = float(max_err(X, g, best_c))
    idx = np.unique(np.linspace(0, n - 1, min(n, _LP_POINTS)).round().astype(int))
    Xs, gs = X[idx], g[idx]
    slack = lambda T: T * (1 + 1e-6) + 1e-12   # LP tolerance: widen, never narrow

    def lattice_in(lo, hi):
        w = 1e-9 * max(abs(lo), abs(hi)) + 1e-300
        return vals[(vals >= lo - w) & (vals <= hi + w)]

    # Branch on the narrowest intervals first; the widest one (a coefficient near 0, where
    # the lattice is dense) is left to the 1-D search.
    widths = []
    for j in range(m):
        iv = _interval(Xs, gs, slack(best), {}, j)
        widths.append(len(lattice_in(*iv)) if iv else 0)
    order = sorted(range(m), key=lambda j: widths[j])
    last = order[-1]
    nodes = 0

    def leaf(fixed):
        nonlocal best, best_c
        iv = _interval(Xs, gs, slack(best), fixed, last)
        if iv is None:
            return
        cand = lattice_in(*iv)
        if not len(cand):
            return
        base = np.zeros(m)
        for i, v in fixed.items():
            base[i] = v
        r = X @ base - g
        xl = X[:, last]
        f = lambda k: float(np.abs(r + cand[k] * xl).max())
        lo, hi = 0, len(cand) - 1
        while hi - lo > 2:   # ternary search on a unimodal sequence
            m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
            if f(m1) <= f(m2):
                hi = m2
            else:
                lo = m1
        k = min(range(lo, hi + 1), key=f)
        if f(k) < best:
            best = f(k)
            best_c = base.copy()
            best_c[last] = cand[k]

    def node(fixed, depth):
        nonlocal nodes
        nodes += 1
        if nodes > max_nodes:
            raise RuntimeError(f"lattice search exceeded {max_nodes} nodes")
        if depth == m - 1:
            leaf(fixed)
            return
        j = order[depth]
        iv = _interval(Xs, gs, slack(best), fixed, j)
        if iv is None:
            return
        for v in lattice_in(*iv):
            node({**fixed, j: float(v)}, depth + 1)

    node({}, 0)
    return {"err": best, "coeffs": [float(v) for v in best_c], "nodes": nodes, "lp_floor": lp_floor}
