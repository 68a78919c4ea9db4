"""One backward build, launched a few times, for Nsight Compute to profile (H200).

    ncu --kernel-name regex:AttnBwdSm90 --launch-skip 2 --launch-count 1 --set full \
        python3 bench/tools/ncu_bwd.py --mode softcap --evaluator poly --headdim 256 --seqlen 8192 --hq 8 --hkv 4

Runs attn_fwd once (for O and LSE), then attn_bwd `--launches` times on the same inputs at the
given shape (default: the anchor, B=1 S=4096 H 32/8 D=128, causal, BF16, softcap 50), with the
backward's defaults for that shape, so that `--launch-skip 2` profiles a warm launch of the
main backward kernel. Profiling is done by ncu (`bash bench/round.sh ncu`); this file only makes
the launches.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
from ncu_fwd import launcher_inputs, launcher_parser  # noqa: E402


def main(argv=None) -> int:
    args = launcher_parser(__doc__).parse_args(argv)
    import torch
    from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd
    q, k, v, do = launcher_inputs(args, 4)
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
