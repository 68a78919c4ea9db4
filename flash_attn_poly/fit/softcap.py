"""Softcap c*tanh(x/c) (Gemma 2, c = 50) in residual form, scored in logit units.

The kernel computes logit = xc - c*rho(u), u = xc/c, with rho(u) = u - tanh(u) the
packed-bf16 odd D4 program (runtime.softcap_logit).  BF16 rounding then lands on
rho ~ u^3/3, not on tanh ~ u: at |x| = 20 logits (u = 0.4) the rho error is
c*0.021*2^-9 ~ 2e-3 logits, where a plain bf16 tanh would cost c*0.38*2^-9 ~ 4e-2.
"""
from __future__ import annotations

import numpy as np

from . import runtime as rt
from .search import as_bits, grid
from .solver import fit_half

C = 50.0
DEGREE = 4


def rho(t):
    return t - np.tanh(t)


def gemma_weight(x):
    """Assumed raw-score density of Gemma-2-like attention logits: mostly within +-20
    with a wide tail (mixture 0.8 N(0, 8^2) + 0.2 N(0, 25^2)); an assumption, not data."""
    return 0.8 / 8 * np.exp(-0.5 * (x / 8) ** 2) + 0.2 / 25 * np.exp(-0.5 * (x / 25) ** 2)


def make(L_i, L_c, c=C, degree=DEGREE, dtype="bf16", weighted=False):
    # weighted: residuals scaled by sqrt(score density) + 5% floor, so the bulk |x| < 20
    # gets the accuracy and the tail is still held by the endpoint constraint.
    w = (lambda t: np.sqrt(gemma_weight(c * t) / gemma_weight(0.0)) + 0.05) if weighted else None
    c64 = fit_half(rho, L_i, degree, weight=w)
    cr = rt.round_to(c64, dtype)
    return {
        "target": "softcap", "derivative": False, "form": "odd", "dtype": dtype,
        "degree": degree, "L_i": float(L_i), "L_c": float(L_c), "offset": 0.0,
        "coeffs": [float(v) for v in cr], "coeffs_bits": as_bits(cr, dtype),
        "coeffs_fp64": [float(v) for v in c64],
        "params": {"c": float(c), "evaluates": "rho(u) = u - tanh(u), u = logit/c",
                   "combine": "logit = fma.rn.f32(-c, rho, xc), xc = clamp(x, +-c*L_c)",
                   "weighted_fit": bool(weighted)},
    }


def errors(program, n=8000):
    c = program["params"]["c"]
    u = np.linspace(0.0, 12.0, n)
    x = np.concatenate([u, -u]) * c
    w = gemma_weight(x)
    out = {"units": "logit"}
    for order in ("real", "separate", "fused"):
        xr = x if order == "real" else rt.round_to(x, "f32")
        e = np.abs(rt.softcap_logit(program, x, order) - c * np.tanh(xr / c))
        name = "real" if order == "real" else f"{program['dtype']}_{order}"
        out[name] = float(e.max())
        out[name + "_weighted_rms"] = float(np.sqrt(np.sum(w * e**2) / np.sum(w)))
    return out


class AttnScore:
    """Selection in the units that matter downstream: relative L2 error of a causal
    softmax-attention output (B=1, H=1, S=1024, D=128, fresh seeded q/k/v, raw score std
    `spreads` logits) with the program's logits in fused replay, divided by the native
    path's (FP32 tanh), worst over the spreads.  Inputs, reference and native error are
    computed once."""

    def __init__(self, c=C, spreads=(10.0, 20.0), S=1024):
        import torch
        from . import attn_metric as am
        self.am, self.torch, self.c, self.cases = am, torch, c, []
        for spread in spreads:
            q, k, v = am.make_inputs(0, H=1, S=S, spread=spread)
            outs = am.softcap_outputs(None, q, k, v, c=c, modes=("native",))
            ref = outs["ref"]
            x32 = am._scores(q, k, torch.float32)
            self.cases.append((x32.double().numpy(), am._causal(S), v, ref, am.rel_l2(outs["native"], ref)))

    def __call__(self, program):
        worst = 0.0
        for x, mask, v, ref, native in self.cases:
            logit = self.torch.from_numpy(rt.softcap_logit(program, x, "fused")).float()
            worst = max(worst, self.am.rel_l2(self.am._softmax_lowp(logit, mask, v), ref) / native)
        return worst


def search(c=C, Li_grid=None, Lc_grid=None, progress=False, degree=DEGREE, dtype="bf16", select="logit"):
    """Plain and density-weighted fits; gate on the uniform max error (<= 2x the best
    plain one), then pick the lowest Gemma-weighted RMS (fused replay in dtype), or with
    select="attn" the lowest AttnScore (attention-output error / native's)."""
    Li_grid = grid(1.5, 5.0) if Li_grid is None else Li_grid
    Lc_grid = grid(1.5, 6.0) if Lc_grid is None else Lc_grid
    jobs = [(li, lc) for li in Li_grid for lc in Lc_grid if lc <= li + 1.0]
    if progress:
        from tqdm import tqdm
        jobs = tqdm(jobs, desc="softcap", leave=False)
    scored = [(errors(p), p) for li, lc in jobs
              for p in (make(li, lc, c, degree, dtype), make(li, lc, c, degree, dtype, weighted=True))]
    fused = f"{dtype}_fused"
    if select == "attn":
        score = AttnScore(c)
        att = [score(p) for _, p in scored]
        i = min(range(len(scored)), key=lambda j: att[j])
        e, p = scored[i]
        e = dict(e, attn_rel_l2_vs_native=att[i])
        p["errors"] = e
        return p
    best_max = min(e[fused] for e, p in scored if not p["params"]["weighted_fit"])
    pool = [(e, p) for e, p in scored if e[fused] <= 2.0 * best_max]
    e, p = min(pool, key=lambda ep: (ep[0][fused + "_weighted_rms"], ep[0][fused]))
    p["errors"] = e
    return p


def make_grad(forward: dict) -> dict:
    """d/du (u - rho(u)) = 1 - rho'(u): the differentiated D3 even program (scale c cancels)."""
    r = np.asarray(forward["coeffs"], np.float64)
    c64 = np.array([1.0 - r[1]] + [-k * r[k] for k in range(2, len(r))])
    dt = forward["dtype"]
    cr = rt.round_to(c64, dt)
    return {
        "target": "softcap", "derivative": True, "form": "even", "dtype": dt,
        "degree": len(r) - 2, "L_i": forward["L_i"], "L_c": forward["L_c"], "offset": 0.0,
        "coeffs": [float(v) for v in cr], "coeffs_bits": as_bits(cr, dt),
        "coeffs_fp64": [float(v) for v in c64],
        "params": {"c": forward["params"]["c"], "backward": "differentiated",
                   "evaluates": "dtanh/du = 1 - rho'(u) at u = x/c (x clamped: rho' of L_c beyond)"},
    }


def make_joint(L_i, L_c, lam, c=C, degree=DEGREE, dtype="bf16", n_nodes=2000):
    """Forward fit built for differentiation: q(t) = sum_{k=2..D} c_k t^k (c1 = 0, so the
    differentiated program's constant is exactly 1 = tanh'(0)), least squares over
    [0, L_i] of the logit error c*(q - rho) and, with weight lam, of the derivative error
    q' - rho' (dtanh/du units), both weighted by sqrt(Gemma score density) + 5% floor."""
    t = np.linspace(0.0, L_i, n_nodes)
    w = np.sqrt(gemma_weight(c * t) / gemma_weight(0.0)) + 0.05
    ks = range(2, degree + 1)
    Av = np.stack([c * t**k for k in ks], 1) * w[:, None]
    Ad = np.stack([k * t ** (k - 1) for k in ks], 1) * (np.sqrt(lam) * w)[:, None]
    drho = 1.0 - 1.0 / np.cosh(t) ** 2
    A = np.vstack([Av, Ad])
    b = np.concatenate([c * rho(t) * w, drho * np.sqrt(lam) * w])
    beta, *_ = np.linalg.lstsq(A, b, rcond=None)
    c64 = np.concatenate([[0.0, 0.0], beta])
    p = make(L_i, L_c, c, degree, dtype)
    cr = rt.round_to(c64, dtype)
    p.update(coeffs=[float(v) for v in cr], coeffs_bits=as_bits(cr, dtype),
             coeffs_fp64=[float(v) for v in c64])
    p["params"].update(weighted_fit=True, joint_lambda=float(lam), c1_zero=True)
    return p


def grad_errors(grad, U=(0.8, 1.2)):
    """Max |error| of dtanh/du (fused) for |u| <= each U (|x| <= c*U), and beyond L_c."""
    u = np.linspace(0.0, 3.0, 6001)
    e = np.abs(rt.replay(grad, u, "fused") - (1.0 - np.tanh(u) ** 2))
    out = {f"bf16_fused_u<={Ui}": float(e[u <= Ui].max()) for Ui in U}
    out["bf16_fused_u<=L_c"] = float(e[u <= grad["L_c"]].max())
    out["bf16_fused_all"] = float(e.max())
    return out
