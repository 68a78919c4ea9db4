"""What a sliding window that masks nothing used to cost: the windowed build against the call it equals.

    python bench/tools/window_noop.py --headdim 128 --cell 4,4096 --cell 16,1024     # H200 / H100

attention() now puts windows in flash-attn's canonical form (interface._canonical_window): a
bound that masks no key is dropped, so `window_size=(S - 1, 0)` (a Mistral / Gemma-2 style
caller at S <= its window) runs the unwindowed kernels and plan rows.  Before, it compiled and ran
the windowed build, which compares every score of its masked blocks with the bounds and takes
none of the rows that need `window: False`.  This tool times that build by the smallest window
that still masks a key, `(S - 2, 0)` (one score of the last query), against no window: rows
`windowed` and `plain` per mode, forward alone and forward + backward, side by side in one
process (bench/protocol.py's interleaved rounds); ratio = windowed / plain time.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import protocol  # noqa: E402

MODES = {"softmax": {}, "softcap": dict(softcap=50.0), "sigmoid": {}}


def parse_cell(text: str) -> tuple:
    """--cell B,S (S >= 3: (S - 2, 0) must mask a key)."""
    return protocol.parse_cell(text, min_seqlen=3)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cell", type=parse_cell, action="append", default=[], metavar="B,S",
                   help="a (batch, seqlen) cell; repeat (default: 4,4096 and 16,1024)")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--modes", default="softmax,softcap,sigmoid", help="comma-separated subset of "
                   + ", ".join(MODES))
    protocol.add_timing_args(p, warmup=10, rounds=5, iters=20)
    protocol.add_json_arg(p, "window_noop")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    modes = a.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"--modes: unknown {bad}; known {sorted(MODES)}")
    import torch
    import flash_attn_poly
    timing = protocol.Timing(warmup=a.warmup, rounds=a.rounds, iters=a.iters)
    rows = []
    for b, s in a.cell or [(4, 4096), (16, 1024)]:
        g = torch.Generator(device="cuda").manual_seed(s)
        mk = lambda h: torch.randn(b, s, h, a.headdim, device="cuda", generator=g, dtype=torch.bfloat16)
        q, k, v = mk(a.hq), mk(a.hkv), mk(a.hkv)
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        do = torch.randn_like(q)
        for mode in modes:
            kw = MODES[mode]
            wins = {"windowed": (s - 2, 0), "plain": (-1, -1)}
            fwd = {n: (lambda w=w: flash_attn_poly.attention(q, k, v, mode=mode, window_size=w, **kw))
                   for n, w in wins.items()}
            both = {n: (lambda f=f: torch.autograd.grad(f(), (q, k, v), do)) for n, f in fwd.items()}
            with torch.no_grad():
                t_f = protocol.time_alternating(fwd, timing)
            t_b = protocol.time_alternating(both, timing)
            for direction, t in (("fwd", t_f), ("fwd+bwd", t_b)):
                rows.append(dict(batch=b, seqlen=s, mode=mode, direction=direction, windowed_ms=t["windowed"],
                                 plain_ms=t["plain"], ratio=t["windowed"] / t["plain"]))
                protocol.progress(f"B={b} S={s} {mode} {direction}: windowed / plain {rows[-1]['ratio']:.3f}")
    res = {**protocol.header(timing), "hq": a.hq, "hkv": a.hkv, "headdim": a.headdim, "rows": rows}
    protocol.report(protocol.output_path(a.json, "window_noop"), res,
                    protocol.markdown_table(rows, ["batch", "seqlen", "mode", "direction", "windowed_ms",
                                                   "plain_ms", "ratio"]),
                    "A window that masks one key (the windowed build) vs none",
                    shape=f"Causal BF16, {a.hq}/{a.hkv} heads, D = {a.headdim}. ", doc=__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
