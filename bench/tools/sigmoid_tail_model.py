"""CPU model of the sigmoid poly forward's O error against the FlashAttention rule, per draw (no GPU).

    python bench/tools/sigmoid_tail_model.py --sk 130,256,1024 --draws 600 --threshold 12 --threshold 4

The kernel's P (kernels/scores/sigmoid.py): on the key columns of the plan's 1/16 split (columns
0-7 of every 128) the default FP16 program `sigmoid_attn_n4096_f16` at x' = x + b + ln 4096
(replayed bit for bit by flash_attn_poly.fit.runtime, 0 below its lower clamp), rounded to BF16;
the other columns sigma(x + b) in FP32 rounded to BF16; a pair whose x' passes the MUFU
threshold (the kernel's `_above_clamp` at plan.SIGMOID_MUFU_ABOVE; the program's clamp 12 before) takes the exact
sigmoid too (modelled per score; the kernel switches all of a thread row's block pairs of that
key block, which only adds exact columns).  O = P V in FP32, rounded to BF16.  Judged by the rule's
own code (flash_attn_poly.testing.judge, as tests/rule_harness.py): 2 x max |O_torch - O_FP64| +
eps(BF16) / 8 x max |O_FP64| (the floor's FP32-noise term left out), O_torch the same math with
exact P rounded to BF16 (reference.attention_ref_lowprec).
Inputs as the fuzz tier draws them (q, k, v ~ N(0, 1) in BF16, D = 128, 2 heads, causal,
S_q = 28 by default: the shape of fuzz20261201_280); the default bias -ln S_k.  Per
(S_k, threshold): draws failing (ratio > 1), the largest and the median ratio, and the native
path's (every column exact) for comparison.
"""
from __future__ import annotations

import argparse
import math

import torch


def one(sq, sk, seed, thresholds, prog, h=2, d=128):
    from flash_attn_poly import reference as R
    from flash_attn_poly.fit import runtime as rt
    from flash_attn_poly.testing import judge
    bf = lambda t: t.to(torch.bfloat16).float()
    n = prog["params"]["n"]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, s, h, d, generator=g).to(torch.bfloat16) for s in (sq, sk, sk))
    b = -math.log(sk)
    ref, _ = R.attention_ref(q.double(), k.double(), v.double(), "sigmoid", causal=True)
    low = R.attention_ref_lowprec(q, k, v, "sigmoid", causal=True)
    low = low[0] if isinstance(low, tuple) else low
    x32 = R.scores(q, k, d ** -0.5, torch.float32)
    allowed = R.causal_mask(sq, sk)
    exact = bf(torch.sigmoid(x32 + torch.tensor(b, dtype=torch.float32)))
    xin = x32 + torch.tensor(b + math.log(n), dtype=torch.float32)
    poly = bf(torch.from_numpy(rt.replay(prog, xin.double().numpy(), "fused")).float())
    poly = torch.where(xin > prog["params"]["lo"], poly, torch.zeros_like(poly))
    cols = torch.arange(sk) % 128 < 8
    # the rule's own ratio (flash_attn_poly.testing.judge; the floor's FP32-noise term left out: magnitude 0)
    out = lambda p: judge("o", bf(torch.einsum("bhqk,bkhd->bqhd", p.masked_fill(~allowed, 0.0), v.float())),
                          ref, low, torch.bfloat16)["ratio"]
    ratios = {f"T={t:g}": out(torch.where(cols & (xin <= t), poly, exact)) for t in thresholds}
    ratios["native"] = out(exact)
    return ratios


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sk", default="130,162,256,1024", help="comma-separated key lengths")
    p.add_argument("--sq", type=int, default=28)
    p.add_argument("--draws", type=int, default=300)
    p.add_argument("--threshold", type=float, action="append", default=[],
                   help="MUFU threshold on x' (repeat; default 12, the program's clamp, and 4)")
    a = p.parse_args(argv)
    from flash_attn_poly.asm import programs as P
    prog = P.entry("sigmoid_attn_n4096_f16")
    ts = a.threshold or [12.0, 4.0]
    for sk in (int(x) for x in a.sk.split(",")):
        rs = [one(a.sq, sk, 1000 * sk + i, ts, prog) for i in range(a.draws)]
        for key in rs[0]:
            v = sorted(r[key] for r in rs)
            print(f"S_k {sk:5d} S_q {a.sq} {key:8s}: fail {sum(x > 1 for x in v):3d} / {len(v)}, "
                  f"max {v[-1]:.3f}, median {v[len(v) // 2]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
