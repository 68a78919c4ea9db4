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
    from flash_attn_poly.kernels import dispatch
    q, k, v = plan_knobs.inputs(args, 3)
    knobs = {text: plan_knobs.parse(text, "fwd") for text in args.knob}
    fns, diffs = {}, {}
    for me, name, plan in plan_knobs.each_plan(q, k, v, args.modes, knobs):
        fn = lambda plan=plan: dispatch.forward(plan, q, k, v)
        out = fn()[0].float()
        fns[f"{me.replace(':', '/')} {name}"] = fn
        if name == "default":
            default = out
        else:
            diffs[f"{me} {name}"] = (default - out).abs().max().item()
            print(f"{me}: max |default - {name}| = {diffs[f'{me} {name}']:.3e}")
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order)
    times = protocol.time_alternating(fns, timing)
    rows = [{"row": n, "ms": t} for n, t in times.items()]
    rows += plan_knobs.ratio_rows(times, [me.replace(":", "/") for me in args.modes.split(",")], list(knobs))
    return {**protocol.header(timing), "shape": protocol.shape_of(args), "knob": " | ".join(args.knob),
            "max_abs_diff": diffs, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p, seqlen=8192, hq=8, hkv=4, headdim=256)
    args, path = plan_knobs.tuning_args(
        p, argv, "fwd", modes="softmax:native,softcap:native,sigmoid:poly", example="num_stages=3",
        knob_help="plan overrides NAME=VALUE[+NAME=VALUE...]: FwdConfig fields (num_stages, tile_n, pingpong, "
                  "row_sum_carry, ...), split=J/K, program=NAME (bench/tools/plan_knobs.py); repeat for more "
                  "variants, each a row beside the default")
    res = run(args)
    protocol.report(path, res, protocol.markdown_table(res["rows"], ["row", "ms"]), f"Forward knobs {res['knob']}",
                    shape=f"Shape: {res['shape']}, causal, BF16. ",
                    notes=f"\nMax |default - knob| per row: {res['max_abs_diff']}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
