"""A two-region FP16 softcap candidate: the residual program below |u| = u0, a tail form above.

Why (docs/NOTES.md, "Softcap at scaled-score std ~20"): the deployed FP16 D5 residual form
logit = xc - c rho(u), rho(u) = u - tanh(u), loses accuracy on the largest scores because
the FP16 rounding of u moves the logit by c tanh^2(u) du, and the largest scores carry most
of the softmax weight.  Above u0 this module evaluates instead

    logit = sign(x) * (c - c eps(t)),   eps(u) = 1 - tanh(u),   t = |u| - m  (FP32, then f16)

whose input sensitivity is c (1 - tanh^2(u)) du, small exactly where the residual's is large.
eps is a degree-`deg` polynomial in the centred t, least squares on Chebyshev nodes of
[u0, L], coefficients rounded to FP16, Horner in FP16 (fma.rn.f16, fused order as
fit.runtime replays the blocks); |x| is clamped at c L.

`tail_logit` is the CPU model that chose the form (FP32 centring, 1.37x native at std 20).
`entries` makes the table pair the kernels run (softcap_c50_f16_tail and its _grad; the
default softcap poly program for part of 2026-11-30, now selectable by name: see
flash_attn_poly/plan.py PROGRAM_ROWS): there the block centres in FP16 after rounding |u| (one
packed sub), which scores 1.59x.  `attn_ratios` scores a candidate with softcap.AttnScore (the
selection that picked the deployed entry: attention-output rel L2 over native FP32 tanh's,
at raw score std 10 and 20 logits).
"""
from __future__ import annotations

import numpy as np

from . import runtime as rt

C = 50.0


def fit_tail(u0: float, L: float, deg: int, n: int = 4000) -> tuple[float, np.ndarray]:
    """(centre m, FP16 coefficients c_0..c_deg of eps(m + t)) on Chebyshev nodes of [u0, L]."""
    m = (u0 + L) / 2
    u = np.cos(np.pi * (np.arange(n) + 0.5) / n) * (L - u0) / 2 + m
    A = np.stack([(u - m) ** k for k in range(deg + 1)], 1)
    coef, *_ = np.linalg.lstsq(A, 1.0 - np.tanh(u), rcond=None)
    return m, rt.round_to(coef, "f16")


def tail_logit(residual: dict, x, u0: float, L: float, m: float, coef, c: float = C) -> np.ndarray:
    """Logits of the two-region candidate at FP32 scores x: `residual` (a softcap table
    entry, replayed in fused order) for |x| < c u0, the tail form above (module docstring)."""
    x32 = rt.round_to(np.asarray(x, np.float64), "f32")
    a = np.abs(x32)
    u = rt.mul(np.minimum(a, c * L), rt.round_to(1.0 / c, "f32"), "f32")
    t = rt.round_to(rt.add(u, -m, "f32"), "f16")
    h = np.full_like(t, float(coef[-1]))
    for k in range(len(coef) - 2, -1, -1):
        h = rt.fma(h, t, float(coef[k]), "f16")
    tail = rt.fma(-c, h, c, "f32") * np.sign(x32)
    return np.where(a >= c * u0, tail, rt.softcap_logit(residual, x, "fused"))


def attn_ratios(logit_fn, score=None) -> list[float]:
    """Attention-output rel L2 / native's at each of softcap.AttnScore's spreads."""
    import torch

    from . import attn_metric as am
    from .softcap import AttnScore
    score = score or AttnScore(C)
    out = []
    for x, mask, v, ref, native in score.cases:
        logit = torch.from_numpy(logit_fn(x)).float()
        out.append(am.rel_l2(am._softmax_lowp(logit, mask, v), ref) / native)
    return out


# ------------------------------------------------------------------ table entries (the blocks' programs)
TAIL_NAME = "softcap_c50_f16_tail"


def entries(table: dict, u0: float = 1.0, L: float = 3.0, deg: int = 5,
            command: str = "python -m flash_attn_poly.fit softcap-tail --write") -> dict:
    """The two-region program pair as table entries, built from the table's FP16 residual
    pair (softcap_c50_f16 and its differentiated _grad) and fit_tail:

    * TAIL_NAME (form odd_piecewise2): region 0 (a = |cvt.rn(u)| < u0) the residual's
      coefficients [0, c1..c5] at shift 0; region 1 eps's at shift m; the kernel combines
      logit = fma(-c, y, A) with A = xc in region 0 and sign(x) c in region 1
      (runtime.softcap_logit; runtime.region_threshold_f32 gives the FP32 test);
    * TAIL_NAME + "_grad" (form even_piecewise2): d logit/dx = the residual grad program's
      1 - rho'(a) in region 0, -eps'(v) (the executed eps differentiated, FP16-rounded) in
      region 1.  Same clamp L, threshold and shifts as the forward."""
    progs = table["programs"]
    res, res_g = progs["softcap_c50_f16"], progs["softcap_c50_f16_grad"]
    if len(res["coeffs"]) != deg + 1 or len(res_g["coeffs"]) != deg:
        raise ValueError("the residual pair's degrees must match the tail's (D and D - 1)")
    m, e = fit_tail(u0, L, deg)
    g64 = np.array([-(k + 1) * e[k + 1] for k in range(deg)])
    g = rt.round_to(g64, "f16")
    from .search import as_bits
    params = {"c": C, "thr": u0, "shift": [0.0, float(m)]}
    fwd = {
        "target": "softcap", "derivative": False, "form": "odd_piecewise2", "dtype": "f16",
        "degree": deg, "L_i": L, "L_c": L, "offset": 0.0,
        "coeffs": [[float(v) for v in res["coeffs"]], [float(v) for v in e]],
        "coeffs_bits": [list(res["coeffs_bits"]), as_bits(e, "f16")],
        "params": {**params, "evaluates": "rho(u) = u - tanh(u) below u0, sign(u) eps(|u| - m) above "
                   "(eps = 1 - tanh); u = logit/c",
                   "combine": "logit = fma.rn.f32(-c, y, A), A = xc below u0, copysign(c, xc) above; "
                   "xc = clamp(x, +-c*L_c)"},
        "fit": {"command": command, "residual": "softcap_c50_f16 (as is)",
                "tail": f"least squares of 1 - tanh(u) on 4000 Chebyshev nodes of [{u0}, {L}], "
                        f"centred at m = {m}, degree {deg}, FP16-rounded"},
    }
    grad = {
        "target": "softcap", "derivative": True, "form": "even_piecewise2", "dtype": "f16",
        "degree": deg - 1, "L_i": L, "L_c": L, "offset": 0.0,
        "coeffs": [[float(v) for v in res_g["coeffs"]], [float(v) for v in g]],
        "coeffs_bits": [list(res_g["coeffs_bits"]), as_bits(g, "f16")],
        "coeffs_fp64": [list(res_g["coeffs_fp64"]), [float(v) for v in g64]],
        "params": {**params, "backward": "differentiated",
                   "evaluates": "d logit/dx: 1 - rho'(a) below u0 (softcap_c50_f16_grad), -eps'(a - m) above"},
        "fit": {"command": command},
    }
    fwd["coeffs_fp64"] = fwd["coeffs"]
    return {TAIL_NAME: fwd, TAIL_NAME + "_grad": grad}
