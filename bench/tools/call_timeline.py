"""Where a back-to-back call's wall time goes: host cost, kernel time, and idle gaps.

    python bench/tools/call_timeline.py     # H200: bench/out/call_timeline.json (+ .md)

bench/gqa_4096.py's wall-clock times exceed bench/tools/kernel_breakdown.py's summed kernel
times by tens of microseconds per call. This script splits that difference. Shape and rows as
bench/gqa_4096.py (the same callables: forward under no_grad, backward as
`torch.autograd.grad` on a retained graph). Per row and direction:

- host_us: the Python/launch cost of one call, timed with perf_counter over `--iters` calls
  without synchronising (the launch queue never fills at these counts, so the loop measures
  the host alone);
- wall_us: CUDA events around `--iters` back-to-back calls, per call (gqa_4096's quantity);
- kernel_us, idle_us: from a torch.profiler trace of `--iters` calls (CPU and CUDA
  activity): summed kernel durations, and the span from the first kernel's start to the
  last one's end minus that sum, both per call;
- host_late_us: the part of idle_us where the GPU waited for the host, i.e. the next
  kernel's launch call began after the previous kernel had ended (profiler timestamps;
  the profiler's own CPU overhead inflates this a little);
- gaps: the largest idle gaps in one call, in order, with the kernel that follows each.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol, gqa_4096)
import gqa_4096 as G  # noqa: E402
import kernel_breakdown  # noqa: E402
import protocol  # noqa: E402


def _rows():
    rows = [G.ours("softmax", "native"), G.ours("softcap", "poly"), G.ours("sigmoid", "poly")]
    return rows + [r for r in (G.fa4("softmax"), G.fa4("softcap")) if r is not None]


def host_us(fn, iters: int) -> float:
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / iters * 1e6


def wall_us(fn, iters: int) -> float:
    import torch
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters * 1e3


def _trace(fn, iters: int) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    os.unlink(path)
    return ev


def split_trace(ev: list[dict], iters: int) -> dict:
    """kernel_us / idle_us / host_late_us per call and the largest gaps of one call."""
    kernels = sorted((e for e in ev if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    launch = {e["args"]["correlation"]: e["ts"] for e in ev
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    busy = sum(e["dur"] for e in kernels)
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    gaps, late = [], 0.0
    for prev, nxt in zip(kernels, kernels[1:]):
        end = prev["ts"] + prev["dur"]
        gap = max(0.0, nxt["ts"] - end)
        lt = launch.get(nxt["args"].get("correlation"))
        if lt is not None and lt > end:
            late += min(gap, lt - end)
        gaps.append((gap, _kernel_role(nxt["name"])))
    per_call = max(1, len(kernels) // iters)
    one = gaps[len(gaps) // 2: len(gaps) // 2 + per_call]
    return {"kernels_per_call": len(kernels) / iters, "kernel_us": busy / iters,
            "idle_us": (span - busy) / iters, "host_late_us": late / iters,
            "gaps": "; ".join(f"{g:.1f}->{n}" for g, n in one)}


def _kernel_role(name: str) -> str:
    """memset / pre / main / post / fwd from a kernel's name (ours or FA4's)."""
    name = re.sub(r"<.*", "", name)
    for pat, short in (("Pre", "pre"), ("Post", "post"), ("preprocess", "pre"), ("postprocess", "post"),
                       ("elementwise", "memset"), ("Bwd", "main"), ("Backward", "main"),
                       ("Fwd", "fwd"), ("Forward", "fwd")):
        if pat in name:
            return short
    return name[:24]


def run(args) -> dict:
    out = []
    for key, direction, fn in kernel_breakdown.each_call(_rows(), args):
        for _ in range(args.warmup):
            fn()
        h = host_us(fn, args.iters)
        w = wall_us(fn, args.iters)
        t = split_trace(_trace(fn, args.iters), args.iters)
        out.append({"row": key, "dir": direction, "host_us": h, "wall_us": w, **t})
    hdr = protocol.header(protocol_text=(
        f"{args.warmup} warm-up calls; then per row {args.iters} un-synchronised calls (host_us), "
        f"{args.iters} CUDA-event-timed calls (wall_us), and {args.iters} calls under torch.profiler "
        "(CPU+CUDA) for kernel_us / idle_us / host_late_us"))
    return {**hdr, "rows": out}


def main(argv=None) -> int:
    args, path = kernel_breakdown.parse_args(__doc__, "call_timeline", argv, warmup=25, iters=50)
    res = run(args)
    cols = ["row", "dir", "host_us", "wall_us", "kernel_us", "idle_us", "host_late_us", "kernels_per_call", "gaps"]
    protocol.report(path, res, protocol.markdown_table(res["rows"], cols), "Call timeline", doc=__doc__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
