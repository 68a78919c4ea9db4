"""Host time per attention call, measured where the GPU cannot be the bottleneck.

    python bench/host_cost.py --json bench/results/host_cost.json   # on the H200

A tiny shape (default B=1 S=256 H_q=32 H_kv=8 D=128, causal BF16: a few microseconds of
GPU work per kernel) makes every call host-bound, so `--iters` back-to-back calls timed
with perf_counter (synchronised only before and after) measure the host path alone: Python,
torch dispatch, argument marshalling and the kernel launches. Rows:

- ours fwd / bwd through attention() eagerly (torch.autograd.Function) and through the
  custom ops it uses under torch.compile (`torch.ops.flash_attn_poly.attn_fwd`, its
  registered autograd), softmax and sigmoid/poly; bwd = torch.autograd.grad on a retained
  graph, as bench/gqa_4096.py times it;
- ours attn_bwd called directly (kernels/attn_bwd_sm90.attn_bwd), and its parts: the time
  spent inside preprocess, postprocess_dq, the compiled kernel calls (every launch, pre/post
  included) and the torch allocations, accumulated by wrappers (each wrapper adds ~0.2 us);
- FA4 fwd / bwd (flash_attn.cute.flash_attn_func), the same shapes, when installed.
Each row: `--warmup` calls, then the median over `--rounds` of the per-call mean of `--iters`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402


def per_call_us(fn, args) -> float:
    import torch
    for _ in range(args.warmup):
        fn()
    out = []
    for _ in range(args.rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
        out.append((time.perf_counter() - t0) / args.iters * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def _inputs(args, grad: bool):
    import torch
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g).requires_grad_(grad)
    return mk(args.hq), mk(args.hkv), mk(args.hkv)


def ours_rows(args):
    import math

    import torch

    import flash_attn_poly
    rows = {}
    for mode, ev in (("softmax", "native"), ("sigmoid", "poly")):
        q, k, v = _inputs(args, False)
        with torch.no_grad():
            rows[f"ours {mode}/{ev} fwd, attention()"] = lambda q=q, k=k, v=v, mode=mode, ev=ev: (
                flash_attn_poly.attention(q, k, v, mode, evaluator=ev))
        bias = -math.log(args.seqlen) if mode == "sigmoid" else 0.0
        op = lambda q, k, v, mode=mode, ev=ev, bias=bias: torch.ops.flash_attn_poly.attn_fwd(
            q, k, v, mode, ev, True, 0.0, bias, args.headdim ** -0.5, [-1, -1], "cuda")
        rows[f"ours {mode}/{ev} fwd, custom op"] = lambda q=q, k=k, v=v, op=op: op(q, k, v)
        q, k, v = _inputs(args, True)
        out = flash_attn_poly.attention(q, k, v, mode, evaluator=ev)
        dout = torch.randn_like(out)
        rows[f"ours {mode}/{ev} bwd, attention()"] = lambda out=out, q=q, k=k, v=v, dout=dout: (
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        out2 = op(q, k, v)[0]
        rows[f"ours {mode}/{ev} bwd, custom op"] = lambda out=out2, q=q, k=k, v=v, dout=dout: (
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return rows


def fa4_rows(args):
    import torch
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # noqa: BLE001
        print(f"skip FA4: {type(e).__name__}: {e}")
        return {}
    q, k, v = _inputs(args, False)
    rows = {}
    with torch.no_grad():
        rows["fa4 softmax fwd"] = lambda: flash_attn_func(q, k, v, causal=True)
    qg, kg, vg = _inputs(args, True)
    out = flash_attn_func(qg, kg, vg, causal=True)
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn_like(out)
    rows["fa4 softmax bwd"] = lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
    return rows


def attn_bwd_parts(args) -> list[dict]:
    """attn_bwd (sigmoid/poly and softmax) called directly, time inside its parts."""
    import torch

    from flash_attn_poly.kernels import attn_bwd_sm90 as A, compile_cache
    from flash_attn_poly.kernels import attn_fwd_sm90 as F
    acc = defaultdict(float)

    def timed(name, fn):
        def w(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[name] += time.perf_counter() - t0
        return w

    pp = A.prepost_module()
    saved = (pp.preprocess, pp.postprocess_dq, compile_cache.compiled, torch.zeros, torch.empty_like)
    pp.preprocess = timed("preprocess (pre kernel)", pp.preprocess)
    pp.postprocess_dq = timed("postprocess_dq (post kernel)", pp.postprocess_dq)
    lookup = compile_cache.compiled
    compile_cache.compiled = lambda family, key, build: timed(
        "compiled kernel calls (all launches)", lookup(family, key, build))
    torch.zeros = timed("torch.zeros", torch.zeros)
    torch.empty_like = timed("torch.empty_like", torch.empty_like)
    rows = []
    try:
        for mode, ev in (("softmax", "native"), ("sigmoid", "poly")):
            q, k, v = _inputs(args, False)
            o, lse = F.attn_fwd(q, k, v, mode=mode, evaluator=ev, causal=True)
            do = torch.randn_like(q)
            fn = lambda: A.attn_bwd(do, q, k, v, o, lse, mode=mode, evaluator=ev, causal=True)
            for _ in range(args.warmup):
                fn()
            acc.clear()
            total = per_call_us(fn, argparse.Namespace(warmup=0, rounds=1, iters=args.iters))
            rows.append({"row": f"ours {mode}/{ev} attn_bwd direct", "us": total})
            for name, sec in sorted(acc.items()):
                rows.append({"row": f"  inside: {name}", "us": sec / args.iters * 1e6})
    finally:
        pp.preprocess, pp.postprocess_dq, compile_cache.compiled, torch.zeros, torch.empty_like = saved
    return rows


def run(args) -> dict:
    rows = [{"row": name, "us": per_call_us(fn, args)} for name, fn in {**ours_rows(args), **fa4_rows(args)}.items()]
    rows += attn_bwd_parts(args)
    timing = protocol.Timing(args.warmup, args.rounds, args.iters)
    hdr = protocol.header(timing)
    hdr["shape"] = dict(batch=args.batch, seqlen=args.seqlen, hq=args.hq, hkv=args.hkv, headdim=args.headdim)
    hdr["protocol"] = (f"{args.warmup} warm-up calls, then the median over {args.rounds} rounds of "
                       f"the perf_counter mean of {args.iters} back-to-back calls (host-bound shape)")
    return {**hdr, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    p.set_defaults(seqlen=256)
    protocol.add_timing_args(p, warmup=30, rounds=5, iters=200)
    p.add_argument("--json")
    args = p.parse_args(argv)
    res = run(args)
    table = protocol.markdown_table(res["rows"], ["row", "us"])
    print(table)
    if args.json:
        protocol.write_results(args.json, res,
                               f"# Host time per call ({res['device']}, {res['date']}, commit {res['commit']})\n\n"
                               f"Shape {res['shape']}. Protocol: {res['protocol']}.\n\n"
                               f"{protocol.doc_body(__doc__)}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
