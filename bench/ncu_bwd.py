"""One backward build, launched a few times, for Nsight Compute to profile (H200).

    ncu --kernel-name regex:AttnBwdSm90 --launch-skip 2 --launch-count 1 --set full \
        python3 bench/ncu_bwd.py --mode softcap --evaluator poly --headdim 256 --seqlen 8192 --hq 8 --hkv 4

Runs attn_fwd once (for O and LSE), then attn_bwd `--launches` times on the same inputs at the
given shape (default: the anchor, B=1 S=4096 H 32/8 D=128, causal, BF16, softcap 50), with the
backward's defaults for that shape, so that `--launch-skip 2` profiles a warm launch of the
main backward kernel. Profiling is done by ncu (bench/h200_round.sh ncu47); this file only makes
the launches.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    p.add_argument("--mode", default="softcap")
    p.add_argument("--evaluator", default="native")
    p.add_argument("--launches", type=int, default=4)
    args = p.parse_args(argv)
    import torch
    from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g)
    q, k, v = mk(args.hq), mk(args.hkv), mk(args.hkv)
    do = mk(args.hq)
    kw = dict(mode=args.mode, evaluator=args.evaluator, causal=True,
              softcap=50.0 if args.mode == "softcap" else None)
    o, lse = attn_fwd(q, k, v, **kw)
    for _ in range(args.launches):
        attn_bwd(do, q, k, v, o, lse, **kw)
    torch.cuda.synchronize()
    print(f"bwd {args.mode}/{args.evaluator} D={args.headdim} S={args.seqlen}: {args.launches} launches done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
