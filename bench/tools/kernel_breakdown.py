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


def run(args) -> dict:
    out = []
    for backward in (False, True):
        fns = G._prepare(rows_of(args), args, backward)
        for key, fn in fns.items():
            per = profile(fn, args.warmup, args.iters)
            total = sum(per.values())
            for kname, us in sorted(per.items(), key=lambda kv: -kv[1]):
                out.append({"row": key, "dir": "bwd" if backward else "fwd", "kernel": kname,
                            "us_per_call": us, "share": us / total if total else None})
            out.append({"row": key, "dir": "bwd" if backward else "fwd", "kernel": "(sum)",
                        "us_per_call": total, "share": 1.0})
    timing = protocol.Timing(args.warmup, 1, args.iters)
    hdr = protocol.header(timing)
    hdr["protocol"] = (f"{args.warmup} warm-up calls, then {args.iters} calls under torch.profiler "
                       "(CUDA activity); per kernel: summed device time / calls")
    return {**hdr, "rows": out}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=20)
    protocol.add_json_arg(p, "kernel_breakdown")
    args = p.parse_args(argv)
    path = protocol.output_path(args.json, "kernel_breakdown")
    res = run(args)
    table = protocol.markdown_table(res["rows"], ["row", "dir", "kernel", "us_per_call", "share"])
    print(table)
    protocol.write_results(path, res,
                           f"# Per-kernel device time ({res['device']}, {res['date']}, commit {res['commit']})\n\n"
                           f"Protocol: {res['protocol']}.\n\n{protocol.doc_body(__doc__)}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
