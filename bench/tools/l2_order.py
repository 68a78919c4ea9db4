"""The persistent forward's tile order seen from L2 (CPU; a count, no timing): per call shape and
section size, how many CTAs of a round read each head's K / V at once, how many MB of other heads'
K / V pass between two rounds that use it, and the DRAM rate the re-reads would need if none of
them hit L2 (docs/MEASURED.md fwd-l2-section).

    python bench/tools/l2_order.py --batch 32 --seqlen 512 --hq 32 --hkv 32 --headdim 128 --ms 0.334 \
        [--non-causal] [--sections 4,8,16,32] [--ctas N]

The order is the kernel's (kernels/tile_scheduler.py: the sectioned LPT order over (batch, head)
units, CTA c taking tile r * ctas + ... in round r); a round is `ctas` consecutive tiles (the snake
changes which CTA takes a tile, not which tiles a round holds).  A tile reads its KV head's K and
V whole (S_k x D x 2 tensors x 2 bytes) and its Q and O (tile_m x D x 2 bytes each).  --ms: a
measured time of the call, for the DRAM rate column (bytes if every cross-round reuse misses).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def order_stats(batch: int, seqlen: int, hq: int, hkv: int, headdim: int, section_mb: int, ctas: int,
                tile_m: int = 128) -> dict:
    """sharers: CTAs per KV head in a round (mean); reuse_mb: median MB of distinct K / V read
    between two rounds that use a head; rereads: cross-round reuses (each a DRAM read when L2 has
    lost the head); kv_mb_if_missed: K / V bytes read if every reuse misses (plus the first reads)."""
    import torch
    from flash_attn_poly.kernels.tile_scheduler import heads_per_section, lpt_tiles
    g = hq // hkv
    blocks = -(-seqlen // tile_m)
    units = hq * batch
    group = heads_per_section(units, seqlen, headdim * 4, g, section_mb << 20)
    tiles = blocks * units
    _, unit = lpt_tiles(torch.arange(tiles), blocks, units, group)
    kv = (unit // g).tolist()
    per_head_mb = seqlen * headdim * 4 / 2 ** 20
    rounds = collections.defaultdict(set)
    for t in range(tiles):
        rounds[t // ctas].add(kv[t])
    last, gaps = {}, []
    for r in sorted(rounds):
        for u in rounds[r]:
            if u in last and last[u] != r:
                between = set().union(*(rounds[x] for x in range(last[u] + 1, r + 1)))
                gaps.append(len(between) * per_head_mb)
            last[u] = r
    heads_read = sum(len(v) for v in rounds.values())
    return {"section_heads": group, "sharers": ctas * len(rounds) / heads_read if heads_read else 0.0,
            "reuse_mb": sorted(gaps)[len(gaps) // 2] if gaps else 0.0, "rereads": len(gaps),
            "kv_mb_if_missed": heads_read * per_head_mb}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seqlen", type=int, required=True)
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=32)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--sections", default="4,8,16,32", help="section sizes in MB")
    ap.add_argument("--ctas", type=int, default=132)
    ap.add_argument("--ms", type=float, default=None, help="a measured call time (ms) for the DRAM rate column")
    a = ap.parse_args(argv)
    qo_mb = 2 * a.batch * a.seqlen * a.hq * a.headdim * 2 / 2 ** 20
    print(f"B={a.batch} S={a.seqlen} H={a.hq}/{a.hkv} D={a.headdim}, {a.ctas} CTAs; Q + O {qo_mb:.0f} MB")
    print("| section MB | heads per section | CTAs per KV head and round | median reuse distance MB | "
          "cross-round reuses | K / V MB if every reuse misses | DRAM TB/s at --ms |")
    print("|---|---|---|---|---|---|---|")
    for mb in (int(x) for x in a.sections.split(",")):
        s = order_stats(a.batch, a.seqlen, a.hq, a.hkv, a.headdim, mb, a.ctas)
        rate = "" if a.ms is None else f"{(s['kv_mb_if_missed'] + qo_mb) * 2 ** 20 / (a.ms * 1e-3) / 1e12:.2f}"
        print(f"| {mb} | {s['section_heads']} | {s['sharers']:.2f} | {s['reuse_mb']:.1f} | {s['rereads']} | "
              f"{s['kv_mb_if_missed']:.0f} | {rate} |")


if __name__ == "__main__":
    main()
