"""One backward build, launched a few times, for Nsight Compute to profile (H200).

    ncu --kernel-name regex:AttnBwdSm90 --launch-skip 2 --launch-count 1 --set full \
        python3 bench/tools/ncu_bwd.py --mode softcap --evaluator poly --headdim 256 --seqlen 8192 --hq 8 --hkv 4

Runs the forward of the plan attention() resolves once (for O and LSE), then its backward
`--launches` times on the same inputs at the given shape (default: the anchor, B=1 S=4096 H 32/8
D=128, causal unless --non-causal, BF16, softcap 50), so that `--launch-skip 2` profiles a warm launch of the main
backward kernel. Profiling is done by ncu (`bash bench/round.sh ncu`); this file only makes
the launches.

`--impl fa4` launches flash-attn-4's backward instead (softmax, or softcap 50 with `--mode softcap`;
its main kernel: `--kernel-name regex:BackwardSm90`), through autograd on one retained graph, for
a profile of the anchor beside ours at the same shape.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import plan_knobs  # noqa: E402
from ncu_fwd import launcher_inputs, launcher_parser, launcher_plan  # noqa: E402


def main(argv=None) -> int:
    p = launcher_parser(__doc__)
    p.add_argument("--impl", choices=("ours", "fa4"), default="ours")
    p.add_argument("--knob", help="plan overrides NAME=VALUE[+NAME=VALUE...] (bench/tools/plan_knobs.py)")
    args = p.parse_args(argv)
    import torch
    if args.impl == "fa4":
        from flash_attn.cute import flash_attn_func
        q, k, v, do = launcher_inputs(args, 4)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = flash_attn_func(q, k, v, causal=not args.non_causal, softcap=50.0 if args.mode == "softcap" else 0.0)
        out = out[0] if isinstance(out, tuple) else out
        for _ in range(args.launches):
            torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
        print(f"fa4 bwd {args.mode} D={args.headdim} S={args.seqlen}: {args.launches} launches done")
        return 0
    from flash_attn_poly.kernels import dispatch
    q, k, v, do = launcher_inputs(args, 4)
    plan = launcher_plan(args, q, k, v, plan_knobs.parse(args.knob, "bwd") if args.knob else None)
    o, lse = dispatch.forward(plan, q, k, v)
    for _ in range(args.launches):
        dispatch.backward(plan, do, q, k, v, o, lse)
    torch.cuda.synchronize()
    print(f"bwd {args.mode}/{args.evaluator} D={args.headdim} S={args.seqlen}: {args.launches} launches done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
