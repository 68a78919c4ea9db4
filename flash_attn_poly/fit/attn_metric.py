"""Attention-output error of the polynomial score programs against the native path.

CPU, torch float64 reference.  Small causal attention problems with fresh random
inputs per seed; for each one the output O is computed three ways

* ``ref``     FP64 scores, the exact score function in FP64, FP64 softmax / PV.
* ``native``  the kernel's native data flow emulated: FP32 scores, the exact function in
              FP32 (softcap: optionally with a tanh.approx error model, |eps| <= 2^-11
              relative, uniform random), P rounded to BF16 before PV, FP32 accumulation
              (softmax: FP32 row sums of the unrounded P), BF16 output.
* ``poly``    the same data flow with the score function replaced by the program replayed
              in fused order (``fit.runtime``), exactly as the kernel feeds it:
              sigmoid: x' = x + b + ln n_prog (FP32 add) -> block -> P (BF16, used as is);
              softcap: ``runtime.softcap_logit`` -> logits, then softmax as native.

Sigmoid diagnostics, the floors a better program could reach:
* ``bf16in``    the exact function of the BF16-rounded block input (what a perfect program
                behind the block's cvt.rn.bf16x2.f32 could reach);
* ``f16in``     the same behind an FP16 input (an f16x2 block);
* ``poly_real`` the program in exact arithmetic on the FP32 input: its fit error alone.

Reported per mode/spread: max abs error and relative L2 error of O (over all seeds), and
the ratios poly/native.  ``python -m flash_attn_poly.fit attn-metric``.
"""
from __future__ import annotations

import json
import math

import numpy as np
import torch

from . import runtime as rt

DEFAULTS = {
    # sigmoid: scaled scores x ~ N(0, s^2); softcap: raw scaled scores std s (logits)
    "sigmoid": {"spreads": (1.0, 2.0, 3.0), "program": "sigmoid_attn_n4096"},
    "softcap": {"spreads": (10.0, 20.0), "program": "softcap_c50"},
}


def rel_l2(o: torch.Tensor, ref: torch.Tensor) -> float:
    """||o - ref|| / ||ref||."""
    return math.sqrt(float(((o - ref) ** 2).sum()) / float((ref ** 2).sum()))


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype)


def make_inputs(seed, B=1, H=2, S=1024, D=128, spread=1.0):
    """q, k, v as BF16 values (held in float64); q scaled so that x = q.k/sqrt(D) has std
    ~spread."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g, dtype=torch.float64) * spread
    k = torch.randn(B, H, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, S, D, generator=g, dtype=torch.float64)
    return _bf16(q), _bf16(k), _bf16(v)


def _scores(q, k, dtype):
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    if dtype == torch.float64:
        return (q @ k.transpose(-1, -2)) * scale
    s = q.float() @ k.float().transpose(-1, -2)
    return s * torch.tensor(scale, dtype=torch.float32)


def _causal(S):
    return torch.ones(S, S, dtype=torch.bool).tril()


def _pv_lowp(P32, v, rowsum=None):
    """BF16 P (already rounded) @ BF16 V in FP32, optional 1/rowsum, BF16 output."""
    o = P32 @ v.float()
    if rowsum is not None:
        o = o / rowsum
    return _bf16(o).double()


SIGMOID_PATHS = ("native", "poly", "bf16in", "f16in", "poly_real")


def sigmoid_outputs(program, q, k, v, bias=None, modes=SIGMOID_PATHS):
    S_k = k.shape[-2]
    b = -math.log(S_k) if bias is None else float(bias)
    mask = _causal(q.shape[-2])
    x64 = _scores(q, k, torch.float64)
    out = {"ref": (torch.sigmoid(x64 + b) * mask) @ v}
    x32 = _scores(q, k, torch.float32)
    if "native" in modes:
        P = _bf16(torch.sigmoid(x32 + torch.tensor(b, dtype=torch.float32))) * mask
        out["native"] = _pv_lowp(P, v)
    if program is not None:
        n = program["params"]["n"]
        xin = (x32 + torch.tensor(b + math.log(n), dtype=torch.float32)).double().numpy()
        for path, order in (("poly", "fused"), ("poly_real", "real")):
            if path in modes:
                P = torch.from_numpy(rt.replay(program, xin, order)).float() * mask
                # a BF16 block's P feeds PV as is; exact or FP16 P is rounded to BF16 first
                exact_bf16 = order == "fused" and program["dtype"] == "bf16"
                out[path] = _pv_lowp(P if exact_bf16 else _bf16(P), v)
        for path, dt in (("bf16in", "bf16"), ("f16in", "f16")):
            if path in modes:
                xb = rt.round_to(rt.round_to(xin, "f32"), dt)
                p = 1.0 / (1.0 + np.exp(-(xb - math.log(n))))
                P = _bf16(torch.from_numpy(p).float()) * mask
                out[path] = _pv_lowp(P, v)
    return out


def _softmax_lowp(l32, mask, v):
    l32 = l32.masked_fill(~mask, float("-inf"))
    m = l32.amax(-1, keepdim=True)
    p = torch.exp(l32 - m)
    return _pv_lowp(_bf16(p), v, p.sum(-1, keepdim=True))


def softcap_outputs(program, q, k, v, c=None, modes=("native", "poly"), tanh_eps=0.0, seed=0):
    c = float(program["params"]["c"]) if c is None else float(c)
    mask = _causal(q.shape[-2])
    x64 = _scores(q, k, torch.float64)
    l64 = (c * torch.tanh(x64 / c)).masked_fill(~mask, float("-inf"))
    out = {"ref": torch.softmax(l64, -1) @ v}
    x32 = _scores(q, k, torch.float32)
    if "native" in modes:
        t = torch.tanh(x32 * torch.tensor(1.0 / c, dtype=torch.float32))
        if tanh_eps:
            g = torch.Generator().manual_seed(10_000 + seed)
            t = t * (1 + (torch.rand(t.shape, generator=g) * 2 - 1) * tanh_eps)
        out["native"] = _softmax_lowp(t * torch.tensor(c, dtype=torch.float32), mask, v)
    if program is not None and "poly" in modes:
        l = rt.softcap_logit(program, x32.double().numpy(), "fused")
        out["poly"] = _softmax_lowp(torch.from_numpy(l).float(), mask, v)
    return out


def logit_errors(program, x):
    """Distribution of |logit error| of the poly softcap at the given FP32 scores."""
    c = float(program["params"]["c"])
    x32 = rt.round_to(x, "f32")
    e = np.abs(rt.softcap_logit(program, x32, "fused") - c * np.tanh(x32 / c))
    return {"max": float(e.max()), "p99": float(np.quantile(e, 0.99)),
            "p50": float(np.quantile(e, 0.5)), "rms": float(np.sqrt(np.mean(e**2)))}


def evaluate(mode, program, seeds=(0, 1, 2), spreads=None, S=1024, H=2, D=128, tanh_eps=0.0,
             logits=True):
    """Error summary per spread: {spread: {path: {max_abs, rel_l2}, ratios}}."""
    spreads = DEFAULTS[mode]["spreads"] if spreads is None else spreads
    res = {}
    for s in spreads:
        acc = {}
        lerr = []
        for seed in seeds:
            q, k, v = make_inputs(seed, H=H, S=S, D=D, spread=s)
            if mode == "sigmoid":
                outs = sigmoid_outputs(program, q, k, v)
            else:
                outs = softcap_outputs(program, q, k, v, tanh_eps=tanh_eps, seed=seed)
                if logits and seed == seeds[0]:
                    x32 = _scores(q, k, torch.float32)[..., _causal(S)].double().numpy()
                    lerr.append(logit_errors(program, x32))
                    lerr[-1]["score_absmax"] = float(np.abs(x32).max())
            ref = outs.pop("ref")
            for path, o in outs.items():
                d = acc.setdefault(path, {"max_abs": 0.0, "err2": 0.0, "ref2": 0.0})
                d["max_abs"] = max(d["max_abs"], float((o - ref).abs().max()))
                d["err2"] += float(((o - ref) ** 2).sum())
                d["ref2"] += float((ref**2).sum())
        r = {p: {"max_abs": d["max_abs"], "rel_l2": math.sqrt(d["err2"] / d["ref2"])}
             for p, d in acc.items()}
        if "poly" in r and "native" in r:
            r["ratio_max_abs"] = r["poly"]["max_abs"] / r["native"]["max_abs"]
            r["ratio_rel_l2"] = r["poly"]["rel_l2"] / r["native"]["rel_l2"]
        if lerr:
            r["logit_err"] = lerr[0]
        res[str(s)] = r
    return res


def summary(res):
    """Worst ratios over spreads."""
    return {"attn_out_ratio_rel_l2": max(v["ratio_rel_l2"] for v in res.values()),
            "attn_out_ratio_max_abs": max(v["ratio_max_abs"] for v in res.values()),
            "attn_out_rel_l2": max(v["poly"]["rel_l2"] for v in res.values()),
            "attn_out_native_rel_l2": max(v["native"]["rel_l2"] for v in res.values())}


def markdown(mode, name, res):
    lines = [f"### {mode}: `{name}`", "",
             "| spread | path | max abs | rel L2 | poly/native (max, L2) |", "|---|---|---|---|---|"]
    for s, r in res.items():
        for p in SIGMOID_PATHS:
            if p in r:
                ratio = (f"{r['ratio_max_abs']:.2f}, {r['ratio_rel_l2']:.2f}" if p == "poly" else "")
                lines.append(f"| {s} | {p} | {r[p]['max_abs']:.3e} | {r[p]['rel_l2']:.3e} | {ratio} |")
    for s, r in res.items():
        if "logit_err" in r:
            le = r["logit_err"]
            lines.append("")
            lines.append(f"- spread {s}: |score| max {le['score_absmax']:.1f}; logit error max "
                         f"{le['max']:.3e}, p99 {le['p99']:.3e}, median {le['p50']:.3e}, rms {le['rms']:.3e}")
    return "\n".join(lines) + "\n"


def main(args, table: dict):
    """The attention-output error of each mode's program of table (args: the CLI's)."""
    out = {}
    md = []
    for mode in args.modes:
        name = args.program.get(mode) if isinstance(args.program, dict) else None
        name = name or DEFAULTS[mode]["program"]
        res = evaluate(mode, table["programs"][name], seeds=tuple(range(args.seeds)), S=args.S,
                       H=args.H, D=args.D, tanh_eps=args.tanh_eps)
        out[mode] = {"program": name, "results": res, "summary": summary(res)}
        md.append(markdown(mode, name, res))
        print(md[-1])
        print(json.dumps(out[mode]["summary"], indent=1))
    return out, md
