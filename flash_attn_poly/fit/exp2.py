"""2^a in FP32 on the FMA pipe (form exp2_f32): the program behind the softcap stage's
exp2 offload (kernels: scores/common.exp2_fma, asm block ``exp2_f32``).

Why: a softcap score costs two MUFU ops (tanh, then ex2).  Offloading the tanh needs a 16-bit
polynomial whose logit error near saturation is ~2x tanh.approx's; offloading the ex2 of a
fraction of the columns instead keeps the tanh on MUFU and costs 3 FADD + 3 FFMA + 1 IMAD per
score in FP32, at a relative error far below BF16 P's rounding.

Program: j = round(a) by the 1.5 * 2^23 add (t = a + M, j = t - M, both exact for |a| < 2^22),
f = a - j in [-0.5, 0.5] (exact), p = c0 + f (c1 + f (c2 + f c3)) by FFMA (Horner from the top),
then 2^j applied by adding j << 23 to p's bits: one mad.lo.s32 on t's bits (t's low word holds
j; (M's bits << 23) vanishes mod 2^32).  Valid for finite a with 2^a normal, a in [-125, 127];
-inf is not mapped to 0 (callers keep MUFU where a score may be masked).

Fit: relative minimax of 2^f on [-0.5, 0.5] by Lawson-reweighted FP64 least squares on
Chebyshev nodes, coefficients rounded to FP32 one at a time from the top (refitting the lower
ones after each rounding); errors() replays the program in FP32 in the block's order.
"""
from __future__ import annotations

import numpy as np

from . import runtime as rt
from .search import as_bits
from .solver import chebyshev_nodes

NAME = "exp2_f32_d3"
DEGREE = 3
HALF = 0.5
MAGIC = 1.5 * 2.0 ** 23          # t = a + MAGIC rounds a to an integer in t's low bits
LAWSON_ITERS = 60


def _basis(f, degree):
    return np.stack([f ** k for k in range(degree + 1)], axis=1)


def fit(degree: int = DEGREE, n_nodes: int = 2000):
    """(coeffs_fp64, coeffs rounded to FP32) of p(f) ~ 2^f on [-0.5, 0.5], relative error."""
    f = chebyshev_nodes(-HALF, HALF, n_nodes)
    y = np.exp2(f)
    A = _basis(f, degree) / y[:, None]            # relative: (p(f) - 2^f) / 2^f
    ones = np.ones_like(f)
    w = np.full_like(f, 1.0 / f.size)
    for _ in range(LAWSON_ITERS):                  # Lawson: weights grow where the error is large
        sw = np.sqrt(w)
        c64 = np.linalg.lstsq(A * sw[:, None], ones * sw, rcond=None)[0]
        err = np.abs(A @ c64 - 1.0)
        w = w * err
        w = w / w.sum()
    fixed = np.zeros(degree + 1)
    for top in range(degree, -1, -1):              # round the top free term, refit the rest
        rest = ones - A[:, top + 1:] @ fixed[top + 1:]
        sol = np.linalg.lstsq(A[:, :top + 1] * np.sqrt(w)[:, None], rest * np.sqrt(w), rcond=None)[0]
        fixed[top] = float(rt.round_to(np.array([sol[top]]), "f32")[0])
    return c64, fixed


def replay(program: dict, a) -> np.ndarray:
    """The block's result for FP32 arguments a, in its instruction order (FP32 arithmetic)."""
    a = rt.round_to(np.asarray(a, np.float64), "f32")
    t = rt.add(a, MAGIC, "f32")
    j = rt.add(t, -MAGIC, "f32")
    f = rt.add(a, -j, "f32")
    c = [float(v) for v in program["coeffs"]]
    p = np.full_like(f, c[-1])
    for k in range(len(c) - 2, -1, -1):
        p = rt.fma(p, f, c[k], "f32")
    return np.ldexp(p, j.astype(np.int64))         # exact: p in [0.7, 1.42], 2^a normal


def errors(program: dict, n: int = 200001) -> dict:
    """Max relative error against 2^a (FP64): over the reduced range in real arithmetic and
    in the FP32 replay, and the replay over a in [-125, 127] (grid plus the reduced range)."""
    f = np.linspace(-HALF, HALF, n)
    c64 = np.asarray(program["coeffs_fp64"])
    real = np.max(np.abs(_basis(f, len(c64) - 1) @ c64 / np.exp2(f) - 1.0))
    a = np.concatenate([np.linspace(-125.0, 127.0, n), f, f + 3.0, f - 7.0])
    a = rt.round_to(a, "f32")
    rep = np.max(np.abs(replay(program, a) / np.exp2(a) - 1.0))
    return {"units": "relative", "real": float(real), "f32_fused": float(rep)}


def make(degree: int = DEGREE) -> dict:
    c64, cr = fit(degree)
    prog = {
        "target": "exp2", "derivative": False, "form": "exp2_f32", "dtype": "f32",
        "degree": degree, "L_i": HALF, "L_c": HALF, "offset": 0.0,
        "coeffs": [float(v) for v in cr], "coeffs_bits": as_bits(cr, "f32"),
        "coeffs_fp64": [float(v) for v in c64],
        "params": {"evaluates": "2^a = 2^j * p(f), j = round(a) (t = a + 1.5*2^23, j = t - 1.5*2^23), "
                                "f = a - j, p(f) = Horner of coeffs (FFMA); 2^j by mad.lo.s32 of t's bits "
                                "<< 23 into p's bits",
                   "valid": "finite a in [-125, 127]; -inf is not mapped to 0"},
        "fit": {"select": "relative minimax on [-0.5, 0.5]: Lawson-reweighted FP64 least squares on "
                          "2000 Chebyshev nodes, FP32 rounding from the top with refits"},
    }
    prog["errors"] = errors(prog)
    return prog
