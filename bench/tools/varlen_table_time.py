"""The varlen tile tables: one kernel launch vs the torch ops, alone and inside the forward / backward.

    python bench/tools/varlen_table_time.py --json $OUT/varlen_table.json     # H200 / H100, ~1 min

Rows, side by side in one process (bench/protocol.py's interleaved rounds, shuffled order):
  table/<batch>/kernel, table/<batch>/torch   the backward's table build alone (kernels/tile_scheduler.py
      bwd_table_kernel vs _bwd_table; compact/...: the forward's compact order, compact_varlen_table
      vs _compact_table) for ragged batches of 32k and 256k tokens (24 and ~200
      sequences; bench/varlen.py's lognormal lengths) and 1024 short sequences;
  bwd/<mode>/d<D>/kernel, .../torch (fwd/...: the forward)   the packed causal backward (attention_varlen, check_inputs=False,
      32/8 heads, BF16, the 32k-token ragged batch) with the table from the kernel or from the
      torch ops (tile_scheduler.VARLEN_TABLE_MAX_SEQS set to -1 around the call);
  bwd/equal/softmax/d64/kernel, .../cache   the same backward on 8 sequences of 4096 keys, where the
      table is the cached host build (equal_bwd_table, "cache") or the kernel's (tile_scheduler._capturing
      forced true around the call, the path a CUDA-graph capture takes): whether equal lengths need
      their own mechanism.
Ratios torch / kernel (> 1: the kernel's table is faster; the equal row: cache / kernel).  Host ms per call (the packed calls'
rows): the Python and launch time of HOST_CALLS back-to-back calls without a sync, per call: where
it nears the GPU time, the call is host-bound and its GPU time is the host's.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import protocol  # noqa: E402
from varlen import ragged_lengths  # noqa: E402

HOST_CALLS = 20


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    protocol.add_timing_args(p, warmup=10, rounds=9, iters=20)
    p.add_argument("--order", choices=sorted(protocol.ORDERS), default="shuffle")
    protocol.add_json_arg(p, "varlen_table")
    args = p.parse_args(argv)
    import torch
    import flash_attn_poly as fap
    from flash_attn_poly.kernels import tile_scheduler as T
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order)

    def cu_of(lens):
        return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")

    batches = {"32k": ragged_lengths(32768, 0), "256k": ragged_lengths(262144, 1),
               "1024x": [1 + (i * 37) % 900 for i in range(1024)]}
    fns = {}
    for name, lens in batches.items():
        cu, mx, total = cu_of(lens), max(lens), sum(lens)
        fns[f"table/{name}/kernel"] = lambda cu=cu, mx=mx, t=total: T.bwd_table_kernel(cu, mx, 128, 32, t, 8)
        fns[f"table/{name}/torch"] = lambda cu=cu, mx=mx, t=total: T._bwd_table(cu, mx, 128, 32, t, 8)
        fns[f"compact/{name}/kernel"] = lambda cu=cu, mx=mx: T.compact_varlen_table(cu, mx, 128)
        fns[f"compact/{name}/torch"] = lambda cu=cu, mx=mx: T._compact_table(cu, -(-mx // 128), 128)
    table = protocol.time_alternating(fns, timing)

    lens = batches["32k"]
    cu, mx, total = cu_of(lens), max(lens), sum(lens)
    limit = T.VARLEN_TABLE_MAX_SEQS
    fns = {}
    for mode, d in (("softmax", 64), ("softmax", 128), ("softcap", 128)):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
                   for h in (32, 8, 8))
        kw = {"softcap": 50.0} if mode == "softcap" else {}
        out = fap.attention_varlen(q, k, v, cu, cu, mx, mx, mode, check_inputs=False, **kw)
        dout = torch.randn_like(out)

        def grad(kernel, out=out, leaves=(q, k, v), dout=dout):
            T.VARLEN_TABLE_MAX_SEQS = limit if kernel else -1
            try:
                return torch.autograd.grad(out, leaves, dout, retain_graph=True)
            finally:
                T.VARLEN_TABLE_MAX_SEQS = limit

        def fwd(kernel, q=q, k=k, v=v, kw=kw, mode=mode):
            T.VARLEN_TABLE_MAX_SEQS = limit if kernel else -1
            try:
                with torch.no_grad():
                    return fap.attention_varlen(q, k, v, cu, cu, mx, mx, mode, check_inputs=False, **kw)
            finally:
                T.VARLEN_TABLE_MAX_SEQS = limit
        a, b = grad(True), grad(False)
        # the same table: the gradients differ only by the order of dQ's atomic adds (run to run)
        diff = max(float((x.float() - y.float()).norm() / y.float().norm()) for x, y in zip(a, b))
        print(f"bwd {mode} d{d}: gradients with either table, max rel L2 difference {diff:.2e}")
        print(f"fwd {mode} d{d}: outputs bit-identical with either table: {torch.equal(fwd(True), fwd(False))}")
        fns[f"bwd/{mode}/d{d}/kernel"] = lambda grad=grad: grad(True)
        fns[f"bwd/{mode}/d{d}/torch"] = lambda grad=grad: grad(False)
        fns[f"fwd/{mode}/d{d}/kernel"] = lambda fwd=fwd: fwd(True)
        fns[f"fwd/{mode}/d{d}/torch"] = lambda fwd=fwd: fwd(False)
    eq_lens = [4096] * 8
    cu_eq, total_eq = cu_of(eq_lens), sum(eq_lens)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(total_eq, h, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (32, 8, 8))
    out = fap.attention_varlen(q, k, v, cu_eq, cu_eq, 4096, 4096, "softmax", check_inputs=False)
    dout = torch.randn_like(out)
    capturing = T._capturing

    def grad_eq(kernel, out=out, leaves=(q, k, v), dout=dout):
        T._capturing = (lambda device: True) if kernel else capturing
        try:
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)
        finally:
            T._capturing = capturing
    a, b = grad_eq(True), grad_eq(False)
    diff = max(float((x.float() - y.float()).norm() / y.float().norm()) for x, y in zip(a, b))
    print(f"bwd equal softmax d64: gradients with either table, max rel L2 difference {diff:.2e}")
    fns["bwd/equal/softmax/d64/kernel"] = lambda: grad_eq(True)
    fns["bwd/equal/softmax/d64/cache"] = lambda: grad_eq(False)
    bwd = protocol.time_alternating(fns, timing)
    host = {}    # host time per call: enqueue only (no sync inside; the queue holds the launches)
    for key, fn in fns.items():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        host[key] = (time.perf_counter() - t0) * 1e3 / HOST_CALLS
        torch.cuda.synchronize()
    rows = dict(table, **bwd)
    def other(k):   # the row a kernel row is held against: the torch ops, or the cache (equal lengths)
        base = k[:-len("kernel")]
        return base + "torch" if base + "torch" in rows else base + "cache"
    ratios = {k[:-len("/kernel")]: rows[other(k)] / rows[k] for k in rows if k.endswith("/kernel")}
    res = {**protocol.header(timing), "batches": {n: {"sequences": len(v), "tokens": sum(v), "max_len": max(v)}
                                                  for n, v in batches.items()},
           "rows_ms": rows, "ratios_torch_over_kernel": ratios, "host_ms_per_call": host}
    lines = ["| row | kernel ms | torch (cache) ms | torch (cache) / kernel | host ms per call (kernel / torch) |",
             "|---|---|---|---|---|"]
    for k, r in ratios.items():
        o = other(k + "/kernel")
        h = f"{host[k + '/kernel']:.4f} / {host[o]:.4f}" if k + "/kernel" in host else ""
        lines.append(f"| {k} | {rows[k + '/kernel']:.4f} | {rows[o]:.4f} | {r:.3f} | {h} |")
    shape = "Batches: " + ", ".join(f"{n} {v['sequences']} sequences, {v['tokens']} tokens, longest {v['max_len']}"
                                    for n, v in res["batches"].items()) + ". "
    protocol.report(protocol.output_path(args.json, "varlen_table"), res, "\n".join(lines),
                    "Varlen tile tables: one launch vs torch ops", shape=shape, doc=__doc__)

if __name__ == "__main__":
    main()
