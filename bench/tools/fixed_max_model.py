"""CPU model of the softcap kernel pipeline on one fuzz draw's shape, judged by the FlashAttention rule
(tests/rule_harness.judge_case) over N CPU input draws: the forward under the constant max c - 20 (O divided
by the sum of the BF16-rounded P, LSE from the FP32 sum: "fixed"), the same with D scaled by sum(rounded P) /
sum(P) ("corr"), or under the row max ("online"); the backward in FP32 with P and dS rounded to BF16 and D
from the BF16 O.  `approx` rounds tanh to 11 mantissa bits (a stand-in for tanh.approx.f32's error).

    python bench/tools/fixed_max_model.py 100 [approx]      # CPU, ~2 min per 100 draws
    python bench/tools/fixed_max_model.py --inputs probe.pt [approx]
        # the draws bench/tools/rule_probe.py --save wrote on the GPU: the model on exactly those inputs,
        # its rule ratios beside the kernel's, and how far the kernel's O / LSE / gradients are from the model's

The "d32" and "dexact" variants are the fixed form with the backward's D = rowsum(dO * O) taken from the
unrounded FP32 O, or as sum_j P_j dP_j: where they pass and "fixed" misses, the miss is O's BF16 rounding
entering D (FlashAttention's D), not the constant max's P.

(docs/MEASURED.md fwd-fixed-max-fuzz-miss: the model reproduces the GPU miss on its own inputs.)"""
import sys, torch
import os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests"))
import cases, rule_harness as H
from flash_attn_poly import reference as R

def fwd(q, k, v, cap, kw, causal, variant):
    s_q, s_k = q.shape[1], k.shape[1]
    x = R.scores(q, k, q.shape[-1] ** -0.5, torch.float32)
    allowed = R.window_mask(s_q, s_k, *kw["window_size"])
    if causal: allowed &= R.causal_mask(s_q, s_k)
    t = torch.tanh(x / cap)
    if APPROX:   # tanh.approx.f32: ~2^-11 relative error; modelled by rounding to 11 mantissa bits
        mant, ex = torch.frexp(t); t = torch.ldexp(torch.round(mant * 2048) / 2048, ex)
    x = (cap * t).masked_fill(~allowed, float("-inf"))
    g = q.shape[2] // v.shape[2]
    v_up = v.float().repeat_interleave(g, dim=2)
    m = torch.full_like(x[..., :1], cap - 20.0) if variant != "online" else x.amax(-1, keepdim=True)
    p = torch.exp(x - m); fsum = p.sum(-1); pr = p.to(q.dtype).float(); rsum = pr.sum(-1)
    norm = rsum if variant != "online" else fsum
    o32 = torch.einsum("bhqk,bkhd->bqhd", pr / norm[..., None], v_up)
    o = o32.to(q.dtype)
    lse = (m[..., 0] + torch.log(fsum))
    f = rsum / fsum if variant == "corr" else torch.ones_like(fsum)
    return o, lse, f, x, allowed, o32

D_FROM = {"d32": "o32", "dexact": "exact"}   # the variants' D: from the unrounded O, or sum P dP

def bwd(do, q, k, v, o, lse, f, x, cap, dt, d_from="o", o32=None):
    g = q.shape[2] // v.shape[2]
    k_up = k.float().repeat_interleave(g, dim=2); v_up = v.float().repeat_interleave(g, dim=2)
    p = torch.exp(x - lse[..., None])                      # FP32, masked -> 0
    dp = torch.einsum("bqhd,bkhd->bhqk", do.float(), v_up)
    if d_from == "exact":
        d = (p * dp).sum(-1)
    else:
        d = torch.einsum("bqhd,bqhd->bhq", do.float(), (o32 if d_from == "o32" else o).float()) * f
    xs = x.clone(); xs[torch.isinf(xs)] = 0
    dcap = 1 - (xs / cap) ** 2                            # d logit / dx from the capped logit
    ds = (p * (dp - d[..., None]) * dcap).to(dt).float()
    scale = q.shape[-1] ** -0.5
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, k_up) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q.float()) * scale
    dv = torch.einsum("bhqk,bqhd->bkhd", p.to(dt).float(), do.float())
    fold = lambda t: t.reshape(t.shape[0], t.shape[1], v.shape[2], g, t.shape[3]).sum(3)
    return dq.to(dt), fold(dk).to(dt), fold(dv).to(dt)

def replay(path):
    """The model on the inputs rule_probe.py --save kept (each saved draw, each model variant), beside
    the kernel's ratios; max |kernel - model| / max |model| of O, LSE and the gradients per variant pair
    (fixed max with the kernel's fixed-max variant: the one without fwd.fixed_max=0)."""
    blob = torch.load(path)
    c0 = cases.fuzz_case(blob["fuzz"], sm_count=132)
    for rec in blob["draws"]:
        c = c0 if rec["draw"] == 0 else cases.retarget(c0, tag=rec["tag"])
        dt = H.DTYPES[rec["dtype"]]
        q, k, v, do = (t.to(dt) for t in rec["inputs"])
        print(f"draw {rec['draw']} ({rec['tag']})")
        for name, kv in rec["variants"].items():
            print(f"  kernel {name:28s}", {n: round(r, 3) for n, r in kv["ratio"].items()})
        for var in ("fixed", "corr", "online", "d32", "dexact"):
            o, lse, f, x, allowed, o32 = fwd(q, k, v, c.softcap, c.kwargs(), c.causal,
                                             "fixed" if var in D_FROM else var)
            grads = bwd(do, q, k, v, o, lse, f, x, c.softcap, q.dtype, D_FROM.get(var, "o"), o32)
            ch = H.judge_case(c, q, k, v, do, o, lse, grads)
            print(f"  model  {var:28s}", {n: round(z["ratio"], 3) for n, z in ch.items()})
            kname = next((n for n in rec["variants"] if ("fixed_max=0" in n) == (var == "online")), None)
            if kname is None or var not in ("fixed", "online"):
                continue
            kv = rec["variants"][kname]
            rel = lambda a, b: float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
            fin = torch.isfinite(lse)
            diffs = {"o": rel(kv["o"], o), "lse": rel(kv["lse"][fin], lse[fin]) if fin.any() else 0.0}
            diffs.update({n: rel(a, b) for n, a, b in zip(("dq", "dk", "dv"), kv["grads"], grads)})
            print(f"    kernel {kname} vs model {var}: max |diff| / max |model|",
                  {n: f"{d_:.2e}" for n, d_ in diffs.items()})


if len(sys.argv) > 2 and sys.argv[1] == "--inputs":
    APPROX = len(sys.argv) > 3
    replay(sys.argv[2])
    sys.exit(0)

APPROX = len(sys.argv) > 2
c0 = cases.FUZZ_PINNED[0]   # the fixed-max softcap draw (once fuzz 20261201:208)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 60
stats = {v: {"fail": 0, "dk": [], "dq": []} for v in ("fixed", "corr", "online", "d32")}
for d in range(N):
    c = cases.retarget(c0, tag=f"{c0.tag}cpu{d}")
    q, k, v, do = (t.detach() for t in H.make_inputs(c, "cpu"))
    for var in stats:
        o, lse, f, x, allowed, o32 = fwd(q, k, v, c.softcap, c.kwargs(), c.causal, "fixed" if var in D_FROM else var)
        grads = bwd(do, q, k, v, o, lse, f, x, c.softcap, q.dtype, D_FROM.get(var, "o"), o32)
        ch = H.judge_case(c, q, k, v, do, o, lse.permute(0, 1, 2), grads, directions=("bwd",))
        stats[var]["fail"] += not all(z["ok"] for z in ch.values())
        stats[var]["dk"].append(ch["dk"]["ratio"]); stats[var]["dq"].append(ch["dq"]["ratio"])
for var, s in stats.items():
    dk = sorted(s["dk"]); dq = sorted(s["dq"])
    print(f"{var:7s} fail {s['fail']}/{N}  dk median {dk[N//2]:.3f} p90 {dk[int(N*.9)]:.3f} max {dk[-1]:.3f}  dq median {dq[N//2]:.3f} max {dq[-1]:.3f}")
