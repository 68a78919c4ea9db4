"""FA4's GQA forward with and without its packed-GQA tiling, beside ours (H200 / H100).

    python bench/tools/fa4_pack_gqa.py --headdim 64 --cell 8,2048 --cell 4,4096 --cell 2,8192 --cell 1,16384

flash-attn-4's forward packs the query heads of a KV head into its M tile by default when H_q > H_kv
(`pack_gqa`): a 192-row tile at 32/8 heads is 4 query heads x 48 positions of one KV head, whose
causal range ends closer to a 128-key block boundary than 192 positions' (which end mid block every
other tile): bench/results/fa4_fwd_d64_gqa.md, 7.7% / 6.3% / 2.2% / 1.7% / 0.6% fewer key-block
steps at S = 2k .. 32k (a static count; none at 128 x 128 tiles, D = 128: the control). Ours has no such tiling: its GQA and MHA forward builds are the same. Rows per
cell (B, S): `fa4` (its default, packed), `fa4_nopack` (pack_gqa=False) and `ours` (the plan's
softmax forward), timed side by side in one process (bench/protocol.py's interleaved rounds); the
ratios fa4_nopack / fa4 (what the packing saves FA4) and fa4 / ours, fa4_nopack / ours.  If the
packing is what our GQA-only deficit is, fa4_nopack / fa4 follows the step counts and ours against
fa4_nopack matches our MHA ratios.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import protocol  # noqa: E402

IMPLS = ("fa4", "fa4_nopack", "ours")


parse_cell = protocol.parse_cell   # --cell B,S


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cell", type=parse_cell, action="append", default=[], metavar="B,S",
                   help="a (batch, seqlen) cell; repeat (default: the sweep's 2k-16k GQA cells at 16k tokens)")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--headdim", type=int, default=64)
    p.add_argument("--non-causal", action="store_true", help="no causal mask (default: causal)")
    p.add_argument("--order", choices=sorted(protocol.ORDERS), default="shuffle")
    protocol.add_timing_args(p, warmup=10, rounds=7, iters=20)
    protocol.add_json_arg(p, "fa4_pack_gqa")
    return p


def check(args) -> None:
    if args.hq % args.hkv or args.hq == args.hkv:
        raise SystemExit(f"--hq {args.hq} / --hkv {args.hkv}: a GQA group (H_q a multiple of H_kv, larger)")


def cell_fns(b: int, s: int, args) -> dict:
    """{impl: forward callable} of one cell (softmax, BF16, seeded inputs)."""
    import torch
    import flash_attn_poly as fap
    from flash_attn.cute import flash_attn_func
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(b, s, h, args.headdim, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v = mk(args.hq), mk(args.hkv), mk(args.hkv)
    causal = not args.non_causal
    fns = {"fa4": lambda: flash_attn_func(q, k, v, causal=causal),
           "fa4_nopack": lambda: flash_attn_func(q, k, v, causal=causal, pack_gqa=False),
           "ours": lambda: fap.attention(q, k, v, mode="softmax", causal=causal)}
    with torch.no_grad():
        outs = {n: f() for n, f in fns.items()}
    first = lambda o: o[0] if isinstance(o, tuple) else o
    ref = first(outs["fa4"]).float()
    for n in ("fa4_nopack", "ours"):   # the same attention, or the timing compares different work
        err = (first(outs[n]).float() - ref).abs().max().item()
        if err > 2e-2:
            raise SystemExit(f"cell B={b} S={s}: {n} differs from fa4 by {err:.3e}")
    return fns


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    check(args)
    cells = args.cell or [(8, 2048), (4, 4096), (2, 8192), (1, 16384)]
    import torch
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order)
    rows = []
    for b, s in cells:
        fns = cell_fns(b, s, args)
        with torch.no_grad():
            ms = protocol.time_alternating(fns, timing)
        flops = 4 * b * args.hq * s * s * args.headdim / (2 if not args.non_causal else 1)
        row = {"batch": b, "seqlen": s, **{f"{n}_ms": ms[n] for n in IMPLS},
               **{f"{n}_tflops": flops / ms[n] / 1e9 for n in IMPLS},
               "nopack/fa4": ms["fa4_nopack"] / ms["fa4"], "fa4/ours": ms["fa4"] / ms["ours"],
               "nopack/ours": ms["fa4_nopack"] / ms["ours"]}
        rows.append(row)
        protocol.progress(f"B={b} S={s}: " + ", ".join(f"{n} {ms[n]:.3f} ms" for n in IMPLS))
    path = protocol.output_path(args.json, "fa4_pack_gqa")
    res = {**protocol.header(timing), "hq": args.hq, "hkv": args.hkv, "headdim": args.headdim,
           "causal": not args.non_causal, "rows": rows}
    cols = ["batch", "seqlen"] + [f"{n}_tflops" for n in IMPLS] + ["nopack/fa4", "fa4/ours", "nopack/ours"]
    protocol.report(path, res, protocol.markdown_table(rows, cols), "FA4's packed-GQA forward beside ours",
                    shape=f"H {args.hq}/{args.hkv}, D = {args.headdim}, "
                          f"{'non-causal' if args.non_causal else 'causal'}, BF16 softmax. ",
                    notes=" Ratios are time over time (fa4/ours > 1: ours is faster).", doc=__doc__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
