"""Host time per attention call, measured where the GPU cannot be the bottleneck.

    python bench/tools/host_cost.py                    # H200: bench/out/host_cost.json (+ .md)
    python bench/tools/host_cost.py --profile DIR      # also: each row under cProfile, a report per row

A tiny shape (default B=1 S=256 H_q=32 H_kv=8 D=128, causal BF16: a few microseconds of
GPU work per kernel) makes every call host-bound, so `--iters` back-to-back calls timed
with perf_counter (synchronised only before and after) measure the host path alone: Python,
torch dispatch, argument marshalling and the kernel launches. Rows:

- ours fwd / bwd through attention() eagerly (torch.autograd.Function) and through the
  custom ops it uses under torch.compile (`torch.ops.flash_attn_poly.attn_fwd`, its
  registered autograd), softmax and sigmoid/poly; bwd = torch.autograd.grad on a retained
  graph, as bench/gqa_4096.py times it;
- FA4 fwd / bwd (flash_attn.cute.flash_attn_func), the same shapes, when installed.
Each row: `--warmup` calls, then the median over `--rounds` of the per-call mean of `--iters`.
A row whose callable cannot be built (e.g. a custom-op signature that moved) is reported and
left out. `--profile DIR` says where a row's host time goes, by Python function.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
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
    import torch

    import flash_attn_poly
    from flash_attn_poly import interface
    rows = {}
    for mode, ev in (("softmax", "native"), ("sigmoid", "poly")):
        q, k, v = _inputs(args, False)
        with torch.no_grad():
            rows[f"ours {mode}/{ev} fwd, attention()"] = lambda q=q, k=k, v=v, mode=mode, ev=ev: (
                flash_attn_poly.attention(q, k, v, mode, evaluator=ev))
        qg, kg, vg = _inputs(args, True)
        out = flash_attn_poly.attention(qg, kg, vg, mode, evaluator=ev)
        dout = torch.randn_like(out)
        rows[f"ours {mode}/{ev} bwd, attention()"] = lambda out=out, q=qg, k=kg, v=vg, dout=dout: (
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        # the custom op attention() runs under torch.compile, called directly with the arguments
        # attention() passes it (interface._op_args of the validated call; a row that cannot be
        # built is reported and left out)
        try:
            op_args = interface._op_args(interface.validate(q, k, v, mode, ev))
            op = lambda q, k, v, op_args=op_args: torch.ops.flash_attn_poly.attn_fwd(q, k, v, [], *op_args, "cuda")
            op(q, k, v)
            rows[f"ours {mode}/{ev} fwd, custom op"] = lambda q=q, k=k, v=v, op=op: op(q, k, v)
            out2 = op(qg, kg, vg)[0]
            rows[f"ours {mode}/{ev} bwd, custom op"] = lambda out=out2, q=qg, k=kg, v=vg, dout=dout: (
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        except Exception as e:  # noqa: BLE001 - report and keep the attention() rows
            print(f"skip ours {mode}/{ev} custom-op rows: {type(e).__name__}: {str(e)[:200]}")
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


def profile(fns: dict, args) -> None:
    """--profile DIR: each row's calls under cProfile, one report per row in DIR (functions by
    own and by cumulative time, per call; cProfile's per-function overhead inflates small
    functions), so the rows' host time can be read by Python function."""
    import cProfile
    import io
    import pstats

    import torch
    os.makedirs(args.profile, exist_ok=True)
    for name, fn in fns.items():
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.iters):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        st = pstats.Stats(prof, stream=text)
        text.write(f"{name}: {st.total_tt / args.iters * 1e6:.1f} us host per call under cProfile\n")
        st.sort_stats("tottime").print_stats(args.top)
        st.sort_stats("cumulative").print_stats(args.top)
        path = os.path.join(args.profile, re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") + ".txt")
        with open(path, "w") as f:
            f.write(text.getvalue())
        print(f"{name}: {st.total_tt / args.iters * 1e6:.1f} us/call under cProfile -> {path}")


def run(args) -> dict:
    fns = {**ours_rows(args), **fa4_rows(args)}
    rows = [{"row": name, "us": per_call_us(fn, args)} for name, fn in fns.items()]
    if args.profile:
        profile(fns, args)
    hdr = protocol.header(protocol_text=(
        f"{args.warmup} warm-up calls, then the median over {args.rounds} rounds of the perf_counter "
        f"mean of {args.iters} back-to-back calls (host-bound shape)"))
    return {**hdr, "shape": protocol.shape_of(args), "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    p.set_defaults(seqlen=256)
    protocol.add_timing_args(p, warmup=30, rounds=5, iters=200)
    p.add_argument("--profile", metavar="DIR", help="also profile each row with cProfile, one report per row here")
    p.add_argument("--top", type=int, default=30, help="--profile: functions listed per sort order")
    protocol.add_json_arg(p, "host_cost")
    args = p.parse_args(argv)
    path = protocol.output_path(args.json, "host_cost")
    res = run(args)
    protocol.report(path, res, protocol.markdown_table(res["rows"], ["row", "us"]), "Host time per call",
                    shape=f"Shape {res['shape']}. ", doc=__doc__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
