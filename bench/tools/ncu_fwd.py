"""One forward build, launched a few times, for Nsight Compute to profile (H200).

    ncu --kernel-name regex:AttnFwdSm90 --launch-skip 2 --launch-count 1 --set full \
        python3 bench/tools/ncu_fwd.py --mode softcap --evaluator native --knob pingpong=0

Runs the forward of the plan attention() resolves at the anchor shape (B=1, S=4096, H 32/8,
D=128, causal, BF16, softcap 50) `--launches` times with the given plan overrides
(bench/tools/plan_knobs.py, e.g. pingpong=0),
so that `--launch-skip 2` profiles a warm launch. Profiling itself is done by ncu (see
`bash bench/round.sh ncu`); this file only makes the launches.

`--impl fa4` launches flash-attn-4's forward instead (`--kernel-name regex:ForwardSm90`), `--impl
cudnn` cuDNN's through torch SDPA (softmax; GQA as the sweep calls it: enable_gqa, or K / V
expanded where this torch does not pass it through; its kernel name differs between cuDNN
versions: `ncu --kernel-name regex:cudnn|sm90`, then read the report's names), for a profile
beside ours at the same shape.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import plan_knobs  # noqa: E402
import protocol  # noqa: E402


def launcher_parser(doc: str) -> argparse.ArgumentParser:
    """Shape, mode, evaluator and launch count: the arguments of both ncu launchers."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    p.add_argument("--mode", default="softcap")
    p.add_argument("--evaluator", default="native")
    p.add_argument("--launches", type=int, default=4)
    p.add_argument("--non-causal", action="store_true", help="no causal mask (default: causal)")
    return p


def launcher_inputs(args, n: int) -> list:
    """q, k, v (and a fourth tensor shaped like q when n = 4): seeded BF16 CUDA tensors."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g)
    return [mk(h) for h in (args.hq, args.hkv, args.hkv, args.hq)[:n]]


def launcher_plan(args, q, k, v, knob=None):
    """The plan attention(q, k, v, args.mode, evaluator=args.evaluator) resolves (causal unless
    --non-causal, softcap 50), with the knob's overrides."""
    return plan_knobs.plan_for(q, k, v, args.mode, args.evaluator, knob, causal=not args.non_causal,
                               softcap=50.0 if args.mode == "softcap" else None)


def launch_baseline(args) -> int:
    """FA4's or cuDNN's forward at the launcher's shape, args.launches times: the calls the sweep
    times (bench/sweep.py _make, softcap 50 as here)."""
    import torch
    import sweep
    q, k, v = launcher_inputs(args, 3)
    cell = sweep.Cell(args.mode, args.headdim, not args.non_causal, args.hq, args.hkv, args.seqlen, args.batch)
    made = sweep._make(args.impl, args.mode, cell, q, k, v)
    for _ in range(args.launches):
        made.fn()
    torch.cuda.synchronize()
    print(f"{args.impl} fwd {args.mode} D={args.headdim} S={args.seqlen}: {args.launches} launches done"
          + (f" ({made.note})" if made.note else ""))
    return 0


def main(argv=None) -> int:
    p = launcher_parser(__doc__)
    p.add_argument("--impl", choices=("ours", "fa4", "cudnn"), default="ours")
    p.add_argument("--knob", help="plan overrides NAME=VALUE[+NAME=VALUE...] (bench/tools/plan_knobs.py)")
    args = p.parse_args(argv)
    if args.impl != "ours":
        if args.knob:
            p.error("--knob: plan overrides apply to --impl ours only")
        if args.impl == "cudnn" and args.mode != "softmax":
            p.error(f"--impl cudnn: softmax only (got --mode {args.mode})")
        return launch_baseline(args)
    knob = None
    if args.knob:
        try:
            knob = plan_knobs.parse(args.knob, "fwd")
        except ValueError as e:
            p.error(str(e))
    import torch
    from flash_attn_poly.kernels import dispatch
    q, k, v = launcher_inputs(args, 3)
    plan = launcher_plan(args, q, k, v, knob)
    for _ in range(args.launches):
        dispatch.forward(plan, q, k, v)
    torch.cuda.synchronize()
    print(f"{args.mode}/{args.evaluator} knob={args.knob}: {args.launches} launches done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
