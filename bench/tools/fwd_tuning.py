"""Forward tuning knobs side by side at one shape: the default config vs overrides.

    python bench/tools/fwd_tuning.py --headdim 256 --seqlen 8192 --hq 8 --hkv 4 --knob num_stages=3 \
        --modes softmax:native,softcap:native,sigmoid:poly      # H200

For every mode:evaluator, a `default` row (the plan attention() resolves for the shape) and
one row per `--knob` (the same plan with overrides, e.g. num_stages=3 or pingpong=0: FwdConfig
fields, split=J/K and program=NAME for poly scores; bench/tools/plan_knobs.py) launch the forward
kernel side by side under bench/protocol.py. Before timing, both outputs are computed on the
same inputs and their max abs difference printed (0 for knobs that change CTA order or
pipelining, not arithmetic). Causal, BF16, softcap 50. Writes bench/out/fwd_tuning.json (+ .md)
unless --json.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import plan_knobs  # noqa: E402
import protocol  # noqa: E402


def run(args) -> dict:
    import torch
    from flash_attn_poly.kernels import dispatch
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g)
    q, k, v = mk(args.hq), mk(args.hkv), mk(args.hkv)
    knobs = {text: plan_knobs.parse(text, "fwd") for text in args.knob}
    fns, diffs = {}, {}
    for me in args.modes.split(","):
        mode, ev = me.split(":")
        kw = dict(causal=True, softcap=50.0 if mode == "softcap" else None)
        outs = {}
        mine = [kn for kn in args.knob if ev == "poly" or not knobs[kn].poly_only]
        for kn in sorted(set(args.knob) - set(mine)):
            print(f"{me}: row '{kn}' skipped (split / program / grad_rule knobs need a poly evaluator)")
        for name, knob in [("default", None)] + [(kn, knobs[kn]) for kn in mine]:
            plan = plan_knobs.plan_for(q, k, v, mode, ev, knob, **kw)
            fn = lambda plan=plan: dispatch.forward(plan, q, k, v)
            outs[name] = fn()[0].float()
            fns[f"{mode}/{ev} {name}"] = fn
        for kn in mine:
            diffs[f"{me} {kn}"] = (outs["default"] - outs[kn]).abs().max().item()
            print(f"{me}: max |default - {kn}| = {diffs[f'{me} {kn}']:.3e}")
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order)
    times = protocol.time_alternating(fns, timing)
    rows = [{"row": n, "ms": t} for n, t in times.items()]
    for me in args.modes.split(","):
        mode, ev = me.split(":")
        for kn in args.knob:
            if f"{mode}/{ev} {kn}" not in times:   # a poly-only row
                continue
            a, b = times[f"{mode}/{ev} default"], times[f"{mode}/{ev} {kn}"]
            rows.append({"row": f"{mode}/{ev} {kn} / default", "ms": b / a})
    shape = dict(batch=args.batch, seqlen=args.seqlen, hq=args.hq, hkv=args.hkv, headdim=args.headdim)
    return {**protocol.header(timing), "shape": shape, "knob": " | ".join(args.knob), "max_abs_diff": diffs, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p, seqlen=8192, hq=8, hkv=4, headdim=256)
    p.add_argument("--knob", action="append", default=[],
                   help="plan overrides NAME=VALUE[+NAME=VALUE...]: FwdConfig fields (num_stages, tile_n, "
                        "pingpong, row_sum_carry, ...), split=J/K, program=NAME (bench/tools/plan_knobs.py); "
                        "repeat for more variants, each a row beside the default")
    p.add_argument("--order", choices=sorted(protocol.ORDERS), default="alternate")
    p.add_argument("--modes", default="softmax:native,softcap:native,sigmoid:poly")
    protocol.add_timing_args(p, warmup=10, rounds=5, iters=20)
    protocol.add_json_arg(p, "fwd_tuning")
    args = p.parse_args(argv)
    if not args.knob:
        p.error("give at least one --knob (e.g. --knob num_stages=3)")
    for text in args.knob:
        try:
            plan_knobs.parse(text, "fwd")
        except ValueError as e:
            p.error(str(e))
    path = protocol.output_path(args.json, "fwd_tuning")
    res = run(args)
    table = protocol.markdown_table(res["rows"], ["row", "ms"])
    print(table)
    protocol.write_results(path, res,
                           f"# Forward knobs {res['knob']} ({res['device']}, {res['date']}, commit {res['commit']})\n\n"
                           f"Shape: {res['shape']}, causal, BF16. Protocol: {res['protocol']}.\n"
                           f"Max |default - knob| per row: {res['max_abs_diff']}.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
