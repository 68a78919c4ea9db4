"""Forward tuning knobs side by side at one shape: the default config vs overrides.

    python bench/fwd_tuning.py --headdim 256 --seqlen 8192 --hq 8 --hkv 4 --knob lpt=1 \
        --modes softmax:native,softcap:native,sigmoid:poly --json bench/results/fwd_lpt_d256.json

For every mode:evaluator, two rows run side by side under bench/protocol.py (alternating
order): `default` (AttnFwdConfig.default for that head dim) and `knob` (the same with the
override, e.g. lpt=1 or num_stages=3). Before timing, both outputs are computed on the same
inputs and their max abs difference printed (equal up to nothing: the knobs change CTA order
or pipelining, not arithmetic). Causal, BF16, softcap 50.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402


def _knob(text: str) -> dict:
    k, v = text.split("=")
    return {k: int(v) if k != "lpt" else bool(int(v))}


def run(args) -> dict:
    import torch
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g)
    q, k, v = mk(args.hq), mk(args.hkv), mk(args.hkv)
    knob = _knob(args.knob)
    fns, diffs = {}, {}
    for me in args.modes.split(","):
        mode, ev = me.split(":")
        kw = dict(mode=mode, evaluator=ev, causal=True, softcap=50.0 if mode == "softcap" else None)
        outs = []
        for name, tuning in (("default", None), (args.knob, knob)):
            fn = lambda tuning=tuning, kw=kw: attn_fwd(q, k, v, tuning=tuning, **kw)
            outs.append(fn()[0].float())
            fns[f"{mode}/{ev} {name}"] = fn
        diffs[me] = (outs[0] - outs[1]).abs().max().item()
        print(f"{me}: max |default - {args.knob}| = {diffs[me]:.3e}")
    timing = protocol.Timing(args.warmup, args.rounds, args.iters)
    times = protocol.time_alternating(fns, timing)
    rows = [{"row": n, "ms": t} for n, t in times.items()]
    for me in args.modes.split(","):
        mode, ev = me.split(":")
        a, b = times[f"{mode}/{ev} default"], times[f"{mode}/{ev} {args.knob}"]
        rows.append({"row": f"{mode}/{ev} {args.knob} / default", "ms": b / a})
    shape = dict(batch=args.batch, seqlen=args.seqlen, hq=args.hq, hkv=args.hkv, headdim=args.headdim)
    return {**protocol.header(timing), "shape": shape, "knob": args.knob, "max_abs_diff": diffs, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p, seqlen=8192, hq=8, hkv=4, headdim=256)
    p.add_argument("--knob", default="lpt=1", help="AttnFwdConfig override NAME=INT (lpt, num_stages, ...)")
    p.add_argument("--modes", default="softmax:native,softcap:native,sigmoid:poly")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json")
    args = p.parse_args(argv)
    res = run(args)
    table = protocol.markdown_table(res["rows"], ["row", "ms"])
    print(table)
    if args.json:
        protocol.write_results(args.json, res,
                               f"# Forward knob {args.knob} ({res['device']}, {res['date']}, commit {res['commit']})\n\n"
                               f"Shape: {res['shape']}, causal, BF16. Protocol: {res['protocol']}.\n"
                               f"Max |default - knob| per row: {res['max_abs_diff']}.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
