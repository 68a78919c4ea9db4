"""Host-side cost of one attention call, by Python function (cProfile), on the GPU machine.

    python bench/host_profile.py --out DIR     # on the H200; one .txt per row and direction

bench/call_timeline.py measures how long the host takes per call; this says where. Each
row of bench/gqa_4096.py (ours only, plus FA4 softmax for comparison) runs `--warmup`
calls, then `--iters` calls under cProfile; the report lists the functions by own time and
by cumulative time, per call (cProfile's per-function overhead inflates small functions).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gqa_4096 as G  # noqa: E402
import protocol  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    import torch
    os.makedirs(args.out, exist_ok=True)
    rows = [G.ours("softmax", "native"), G.ours("sigmoid", "poly"), G.ours("softcap", "poly")]
    rows += [r for r in (G.fa4("softmax"),) if r is not None]
    for backward in (False, True):
        for key, fn in G._prepare(rows, args, backward).items():
            for _ in range(args.warmup):
                fn()
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.iters):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            st = pstats.Stats(prof, stream=s)
            total = st.total_tt / args.iters * 1e6
            s.write(f"{key} {'bwd' if backward else 'fwd'}: {total:.1f} us host per call under cProfile\n")
            st.sort_stats("tottime").print_stats(args.top)
            st.sort_stats("cumulative").print_stats(args.top)
            name = f"{key.replace('/', '_')}_{'bwd' if backward else 'fwd'}.txt"
            with open(os.path.join(args.out, name), "w") as f:
                f.write(s.getvalue())
            print(f"{key} {'bwd' if backward else 'fwd'}: {total:.1f} us/call (cProfile)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
