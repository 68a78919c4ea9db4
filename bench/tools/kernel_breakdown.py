"""Per-kernel device time of one attention forward and one backward call, ours vs FA4.

    python bench/tools/kernel_breakdown.py     # H200: bench/out/kernel_breakdown.json (+ .md)

Shape and rows as bench/gqa_4096.py (B=1 S=4096 H_q=32 H_kv=8 D=128 causal BF16; ours
softmax / softcap native, poly / sigmoid native, poly; FA4 softmax and softcap). Each
callable runs `--warmup` times, then `--iters` times under torch.profiler (CUDA activity
only); a row is one kernel's summed device time divided by the number of calls, so the
pre-processing, memset, main kernel and post-processing of the backward show up
separately. Device time only: host dispatch and launch gaps are not in these numbers (the
side-by-side wall times are bench/gqa_4096.py's).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol, gqa_4096)
import gqa_4096 as G  # noqa: E402
import protocol  # noqa: E402


def _short(name: str) -> str:
    """Readable kernel name: drop template arguments and long mangled tails."""
    name = re.sub(r"<.*", "", name)
    name = re.sub(r"_[0-9a-f]{8,}.*", "", name)
    return name[:70]


def profile(fn, warmup: int, iters: int) -> dict[str, float]:
    """{kernel name: device microseconds per call} for `iters` calls of fn."""
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[_short(ev.name)] += ev.time_range.elapsed_us() / iters   # the kernel's own span, us
    return dict(per)


def rows_of(args):
    rows = [G.ours("softmax", "native"), G.ours("softcap", "native"), G.ours("softcap", "poly"),
            G.ours("sigmoid", "native"), G.ours("sigmoid", "poly")]
    return rows + [r for r in (G.fa4("softmax"), G.fa4("softcap")) if r is not None]


def each_call(rows, args):
    """(row key, "fwd" | "bwd", callable) for bench/gqa_4096.py's rows: every forward call
    (under no_grad), then every backward (torch.autograd.grad on a retained graph)."""
    for backward in (False, True):
        for key, fn in G._prepare(rows, args, backward).items():
            yield key, "bwd" if backward else "fwd", fn


def run(args) -> dict:
    out = []
    for key, direction, fn in each_call(rows_of(args), args):
        per = profile(fn, args.warmup, args.iters)
        total = sum(per.values())
        for kname, us in sorted(per.items(), key=lambda kv: -kv[1]):
            out.append({"row": key, "dir": direction, "kernel": kname,
                        "us_per_call": us, "share": us / total if total else None})
        out.append({"row": key, "dir": direction, "kernel": "(sum)", "us_per_call": total, "share": 1.0})
    hdr = protocol.header(protocol_text=(f"{args.warmup} warm-up calls, then {args.iters} calls under "
                                         "torch.profiler (CUDA activity); per kernel: summed device time / calls"))
    return {**hdr, "rows": out}


def parse_args(doc: str, name: str, argv, warmup: int, iters: int):
    """(args, output path) of a per-call tool (this one, call_timeline.py): the shape options
    (bench/gqa_4096.py's defaults), --warmup, --iters and --json (default bench/out/<name>.json)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    protocol.add_timing_args(p, warmup=warmup, rounds=None, iters=iters)
    protocol.add_json_arg(p, name)
    args = p.parse_args(argv)
    return args, protocol.output_path(args.json, name)


def main(argv=None) -> int:
    args, path = parse_args(__doc__, "kernel_breakdown", argv, warmup=10, iters=20)
    res = run(args)
    table = protocol.markdown_table(res["rows"], ["row", "dir", "kernel", "us_per_call", "share"])
    protocol.report(path, res, table, "Per-kernel device time", doc=__doc__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
