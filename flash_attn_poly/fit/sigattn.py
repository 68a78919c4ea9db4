"""Sigmoid-attention program: sigma(x - ln n) as a two-region piecewise D3 (seed B3).

Runtime (fused, see runtime.FUSED_OPS["piecewise2"]): xc = clamp(x, lo, hi) in bf16,
region r = (xc >= thr), u = xc - thr (one sub reusing the thr register), q = Horner D3
in u with region coefficients, p = q^4 by two packed squarings.  A D3 cannot follow e^x
relatively over [-3, 10]; it can follow sigma(x - ln n)^(1/4) ~ e^(x/4) (a quarter of the
exponent range).  The coefficients absorb -ln n, so the block outputs the probability.

Fit: per region, least squares of q with first-order weights of the p^2-weighted relative
error of p (what the attention output sees), then a coordinate search over the bf16
coefficient bits in fused replay (Objective); lo/thr/hi by grid search on the same score.

Backward surrogate: dp = P(u) * (a_r + b_r u)^2 (one more mul than the seed's factored
form: the squared factor follows 1 - sigma), fitted to sigma'(x - ln n) given the
executed bf16 P.
"""
from __future__ import annotations

import numpy as np

from . import runtime as rt
from .search import as_bits, grid
from .targets import sigmoid_attn

BULK = (-9.0, 9.0)        # 3 sigma of the widest score distribution we target, N(0, 3)
SCORE_RANGE = (-12.0, 12.0)


def _x_points(n=8000):
    return np.linspace(SCORE_RANGE[0], SCORE_RANGE[1], n)


def rel_floor(n):
    """Errors are scored relative to max(p, p_floor); p_floor = p(x=-3) ~ 1.2e-5 for
    n = 4096: below that a key's weight is < 5% of a typical (x = 0) key."""
    f, _ = sigmoid_attn(n)
    return float(f(np.array(-3.0)))


SQUARINGS = 2          # p = q^4
SCENARIOS = tuple((s, d) for s in (1.0, 2.0) for d in (0.0, 1.4))   # x ~ N(d, s^2)
ABS_WEIGHT = 0.0       # weight of the max abs error (saturation) in the selection score


def _grid_x(n, dtype="bf16"):
    """Every finite 16-bit value of dtype in [-12, 16] (the block input after cvt.rn) and
    the width of its rounding cell."""
    x = rt.all_inputs(dtype)
    x = np.unique(x[np.isfinite(x) & (x >= -12.0) & (x <= 16.0)])
    mid = (x[1:] + x[:-1]) / 2
    w = np.empty_like(x)
    w[1:-1] = mid[1:] - mid[:-1]
    w[0], w[-1] = w[1], w[-2]
    return x, w


class Objective:
    """Fused-replay score of a forward program on the bf16 grid: for each score scenario
    N(d, s^2) the p^2-weighted relative RMS error (what the attention output sum_j p_j v_j
    sees for random v) plus the p-weighted relative mass error; worst scenario of each,
    summed, plus ABS_WEIGHT * max abs error (the saturation of the clamp)."""

    def __init__(self, n, dtype="bf16"):
        f, _ = sigmoid_attn(n)
        self.x, w = _grid_x(n, dtype)
        self.p = f(self.x)
        self.w = [np.exp(-0.5 * ((self.x - d) / s) ** 2) * w for s, d in SCENARIOS]

    def parts(self, program):
        e = rt.replay(program, self.x, "fused") - self.p
        rms = max(np.sqrt(np.sum(w * e**2) / np.sum(w * self.p**2)) for w in self.w)
        mass = max(np.sum(w * np.abs(e)) / np.sum(w * self.p) for w in self.w)
        return float(rms), float(mass), float(np.abs(e).max())

    def __call__(self, program):
        rms, mass, mx = self.parts(program)
        return rms + mass + ABS_WEIGHT * mx


def fit_region(n, a, b, shift, k, deg=3, n_nodes=4000):
    """Least squares of q(u) = sigma(x - ln n)^(1/k), u = x - shift, on [a, b] with residual
    weights k*p/q * sqrt(scenario density) (first-order p^2-weighted relative error of
    p = q^k, the Objective's rms term) plus a small uniform relative floor."""
    f, _ = sigmoid_attn(n)
    x = np.linspace(a, b, n_nodes)
    p = f(x)
    q = p ** (1.0 / k)
    # scenario densities, each normalised by its p^2 mass (as the Objective's rms term)
    g = np.linspace(-12.0, 16.0, 4000)
    dens = sum(np.exp(-0.5 * ((x - d) / s) ** 2) / np.sum(np.exp(-0.5 * ((g - d) / s) ** 2) * f(g) ** 2)
               for s, d in SCENARIOS)
    w = np.sqrt(dens) * p * k / q
    w = w + 1e-3 * w.max() * p / q
    V = np.stack([(x - shift) ** j for j in range(deg + 1)], axis=1)
    c, *_ = np.linalg.lstsq(V * w[:, None], q * w, rcond=None)
    return c


def make_forward(n, lo, thr, hi, shift=None, dtype="bf16", squarings=SQUARINGS, degree=3):
    """shift None: u = xc; a number: u = xc - shift in both regions (equal to thr, lo or hi
    it costs one sub, reusing that constant's register); a pair: per-region shift (lop3 +
    sub)."""
    k = 2 ** squarings
    if shift is None:
        sh = None
    elif np.ndim(shift) == 0:
        sh = [float(rt.round_to(np.array(shift), dtype))] * 2
    else:
        sh = [float(v) for v in rt.round_to(np.array(shift), dtype)]
    s = sh or [0.0, 0.0]
    c64 = [fit_region(n, lo, thr, s[0], k, deg=degree), fit_region(n, thr, hi, s[1], k, deg=degree)]
    c = [rt.round_to(ci, dtype) for ci in c64]
    return {
        "target": "sigmoid_attn", "derivative": False, "form": "piecewise2", "dtype": dtype,
        "degree": int(degree), "L_i": None, "L_c": None, "offset": 0.0,
        "coeffs": [[float(v) for v in ci] for ci in c],
        "coeffs_bits": [as_bits(ci, dtype) for ci in c],
        "coeffs_fp64": [[float(v) for v in ci] for ci in c64],
        "params": {"n": int(n), "lo": float(lo), "thr": float(thr), "hi": float(hi),
                   "shift": sh, "squarings": int(squarings),
                   "evaluates": f"p = q^{k}, q = D{degree} Horner in u = xc - shift (region coeffs)",
                   "lo_bits": as_bits([lo], dtype)[0], "thr_bits": as_bits([thr], dtype)[0],
                   "hi_bits": as_bits([hi], dtype)[0],
                   "shift_bits": None if sh is None else as_bits(sh, dtype)},
    }


def refine_bits(program, score, rounds=6, steps=(-3, -2, -1, 1, 2, 3)):
    """Coordinate search over the 16-bit coefficient bit patterns (+-3 ulp), in fused replay."""
    dt = program["dtype"]
    p = {**program, "coeffs": [list(c) for c in program["coeffs"]]}
    best = score(p)
    for _ in range(rounds):
        improved = False
        for r in (0, 1):
            for j in range(len(p["coeffs"][r])):
                cur = p["coeffs"][r][j]
                bits = int(rt.to_bits(np.array(cur), dt))
                for st in steps:
                    v = float(rt.from_bits(np.array((bits + st) & 0xFFFF), dt))
                    if not np.isfinite(v):
                        continue
                    p["coeffs"][r][j] = v
                    sc = score(p)
                    if sc < best:
                        best, cur, improved = sc, v, True
                    p["coeffs"][r][j] = cur
        if not improved:
            break
    p["coeffs_bits"] = [as_bits(c, p["dtype"]) for c in p["coeffs"]]
    return p, best


SIGMAS = (1.0, 2.0, 3.0)


def mass_error(program, x, y, ref):
    """Worst over score spreads N(0, s), s in SIGMAS, of E|err| / E[p]: the error of the
    attention mass sum_j p_j relative to its size (what the output sum_j p_j v_j sees)."""
    out = 0.0
    for s in SIGMAS:
        w = np.exp(-0.5 * (x / s) ** 2)
        out = max(out, float(np.sum(w * np.abs(y - ref)) / np.sum(w * ref)))
    return out


def errors(program, grad=False):
    n = program["params"]["n"]
    f, df = sigmoid_attn(n)
    ref = df if grad else f
    x = _x_points()
    floor = rel_floor(n) * (0.25 if grad else 1.0)  # sigma' = p(1-p) ~ p for small p
    bulk = (x >= BULK[0]) & (x <= BULK[1])
    out = {"units": "gradient" if grad else "probability"}
    for order in ("real", "separate", "fused"):
        y = rt.replay(program, x, order)
        xr = x if order == "real" else rt.round_to(rt.round_to(x, "f32"), program["dtype"])
        e = np.abs(y - ref(xr))
        name = "real" if order == "real" else f"{program['dtype']}_{order}"
        out[name] = float(e.max())
        out[name + "_bulk_abs"] = float(e[bulk].max())
        out[name + "_bulk_rel"] = float((e / np.maximum(ref(xr), floor))[bulk].max())
        out[name + "_mass_rel"] = mass_error(program, xr, y, ref(xr))
    return out


def fused_score(program, grad=False):
    f, df = sigmoid_attn(program["params"]["n"])
    x = _x_points(2000)
    xr = rt.round_to(rt.round_to(x, "f32"), program["dtype"])
    ref = (df if grad else f)(xr)
    y = rt.replay(program, x, "fused")
    return mass_error(program, xr, y, ref), float(np.abs(y - ref).max())


def search(n=4096, los=None, thrs=None, his=None, shift="thr", squarings=SQUARINGS,
           top=6, progress=False, dtype="bf16", degree=3):
    """Grid over lo/thr/hi (shift: "thr" = u = xc - thr, one sub; None; or "mid" = per-region
    midpoints), score every candidate with Objective in fused replay, refine the bf16
    coefficient bits of the best `top`, keep the best."""
    ln = np.log(n)
    los = grid(-4.0, -2.5, 0.5) if los is None else los
    thrs = grid(np.round(ln) - 5.0, np.round(ln) - 1.5, 0.25) if thrs is None else thrs
    his = grid(np.round(ln) + 2.5, np.round(ln) + 5.0, 0.5) if his is None else his
    score = Objective(n, dtype)
    jobs = [(lo, t, hi) for lo in los for t in thrs for hi in his if lo < t < hi]
    if progress:
        from tqdm import tqdm
        jobs = tqdm(jobs, desc=f"sigmoid_attn n={n}", leave=False)
    cands = []
    for lo, t, hi in jobs:
        sh = {"thr": t, None: None, "mid": [(lo + t) / 2, (t + hi) / 2]}[shift]
        p = make_forward(n, float(lo), float(t), float(hi), sh, dtype=dtype, squarings=squarings,
                         degree=degree)
        cands.append((score(p), p))
    cands.sort(key=lambda c: c[0])
    p, _ = min((refine_bits(p, score) for _, p in cands[:top]), key=lambda r: r[1])
    rms, mass, mx = score.parts(p)
    p["errors"] = errors(p)
    p["errors"].update(select_rms_p2=rms, select_mass=mass, select_max_abs=mx)
    return p


class GradObjective(Objective):
    """Objective in gradient units: sigma'(x - ln n) in place of p."""

    def __init__(self, n):
        super().__init__(n)
        _, df = sigmoid_attn(n)
        self.p = df(self.x)


def make_grad(forward: dict, g_squared=True) -> dict:
    """dp = P(u) * g_r(u)^2, g_r = a_r + b_r u (g_squared; else dp = P * g_r), fitted to
    sigma'(x - ln n) per region given the executed (fused bf16) P: g ~ sqrt(sigma'/P) by
    relative least squares on every bf16 input, then a coordinate search over the bf16 bits
    of a_r, b_r with GradObjective (fused replay).  g^2 ~ 1 - sigma is positive and convex,
    which a linear factor cannot follow in the upper region."""
    pr = forward["params"]
    _, df = sigmoid_attn(pr["n"])
    xs = rt.all_inputs("bf16")
    xs = xs[np.isfinite(xs) & (xs >= pr["lo"]) & (xs <= pr["hi"])]
    P = rt.replay(forward, xs, "fused")
    m = xs >= pr["thr"]
    sh = pr["shift"] or [0.0, 0.0]
    a64, b64 = [], []
    for r in (0, 1):
        sel = m if r else ~m
        u = rt.round_to(xs[sel] - sh[r], "bf16") if pr["shift"] else xs[sel]
        target = df(xs[sel]) / P[sel]
        if g_squared:
            target = np.sqrt(target)
        A = np.stack([np.ones_like(u), u], axis=1) / target[:, None]
        (a, b), *_ = np.linalg.lstsq(A, np.ones_like(u), rcond=None)
        a64.append(float(a))
        b64.append(float(b))
    g = dict(forward)
    g.update(derivative=True, form="piecewise2_factored", degree=4 if not g_squared else 5)
    g["params"] = dict(pr, forward=f"sigmoid_attn_n{pr['n']}", g_squared=bool(g_squared),
                       a_fp64=a64, b_fp64=b64)
    # bit refinement: reuse refine_bits on a program whose "coeffs" are [[a0, b0], [a1, b1]]
    score = GradObjective(pr["n"])

    def unpack(q):
        out = dict(g)
        out["params"] = dict(g["params"], a=[q["coeffs"][0][0], q["coeffs"][1][0]],
                             b=[q["coeffs"][0][1], q["coeffs"][1][1]])
        return out

    ab = [[float(v) for v in rt.round_to(np.array([a64[r], b64[r]]), "bf16")] for r in (0, 1)]
    probe = {"dtype": "bf16", "coeffs": ab}
    probe, _ = refine_bits(probe, lambda q: score(unpack(q)))
    g = unpack(probe)
    g["params"].update(a_bits=as_bits(g["params"]["a"], "bf16"),
                       b_bits=as_bits(g["params"]["b"], "bf16"))
    rms, mass, mx = score.parts(g)
    g["errors"] = errors(g, grad=True)
    g["errors"].update(select_rms_p2=rms, select_mass=mass, select_max_abs=mx)
    return g
