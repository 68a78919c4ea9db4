"""Forward tuning knobs side by side at one shape: the default config vs overrides.

    python bench/tools/fwd_tuning.py --headdim 256 --seqlen 8192 --hq 8 --hkv 4 --knob num_stages=3 \
        --modes softmax:native,softcap:native,sigmoid:poly      # H200

For every mode:evaluator, a `default` row (the plan attention() resolves for the shape) and
one row per `--knob` (the same plan with overrides, e.g. num_stages=3 or pingpong=0: FwdConfig
fields, split=J/K and program=NAME for poly scores; bench/tools/plan_knobs.py) launch the forward
kernel side by side under bench/protocol.py. Before timing, both outputs are computed on the
same inputs and their max abs difference printed (0 for knobs that change CTA order or
pipelining, not arithmetic; a tile change reorders the sums: a few BF16 ulps). Causal (or
--non-causal), BF16, softcap 50. A knob whose plan no kernel builds for a mode (check_fwd, e.g. tile_n=80 under
sigmoid/poly, whose split cannot repeat in 80 keys) is skipped for that mode with the reason.
Each knob row also prints the plan row it would justify (the cell's call facts and the FwdConfig
fields it changes; bench/tools/plan_knobs.plan_row). Writes bench/out/fwd_tuning.json (+ .md)
unless --json.

--compile-only resolves every row's plan and compiles its kernel (the disk compile cache) without
timing or a GPU: the CPU dry run (CUTE_DSL_ARCH=sm_90a), and on the device machine a parallel
pre-build of several cells before the timed runs load from the cache:

    for c in "--batch 16 --seqlen 1024" "--batch 2 --seqlen 8192 --headdim 64"; do
        python bench/tools/fwd_tuning.py $c --knob num_stages=3 --compile-only & done; wait
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import plan_knobs  # noqa: E402
import protocol  # noqa: E402


def rows(args, device: str):
    """q, k, v, the knobs, the (mode:evaluator, row name, plan) of every row that builds, and the
    refused knob rows."""
    q, k, v = plan_knobs.inputs(args, 3) if device == "cuda" else plan_knobs.inputs(args, 3, device)
    knobs = {text: plan_knobs.parse(text, "fwd") for text in args.knob}
    refused = []
    plans = list(plan_knobs.each_plan(q, k, v, args.modes, knobs, refused,
                                      causal=not args.non_causal, window=args.window))
    return (q, k, v), knobs, plans, refused


def proposed_rows(plans) -> dict:
    """{"<mode:evaluator> <knob>": plan_row} for every knob row (printed as it goes)."""
    out, default = {}, None
    for me, name, plan in plans:
        if name == "default":
            default = plan
            continue
        out[f"{me} {name}"] = row = plan_knobs.plan_row(default, plan)
        print(f"{me} {name}: " + (f"would justify a FWD_ROWS row {row}" if row["sets"] else
                                  "the default's own config (a second default row: the noise floor)"))
    return out


def compile_only(args) -> int:
    """Resolve and compile every row's kernel (no timing, no GPU needed)."""
    _, _, plans, refused = rows(args, "meta")
    proposed_rows(plans)
    n = plan_knobs.compile_plans(plans, backward=False)
    print(f"{n} builds, {len(refused)} knob rows refused")
    return 0


def run(args) -> dict:
    from flash_attn_poly.kernels import dispatch
    (q, k, v), knobs, plans, refused = rows(args, "cuda")
    fns, diffs = {}, {}
    for me, name, plan in plans:
        fn = lambda plan=plan: dispatch.forward(plan, q, k, v)
        out = fn()[0].float()
        fns[f"{me.replace(':', '/')} {name}"] = fn
        if name == "default":
            default = out
        else:
            diffs[f"{me} {name}"] = (default - out).abs().max().item()
            print(f"{me}: max |default - {name}| = {diffs[f'{me} {name}']:.3e}")
    proposed = proposed_rows(plans)
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order)
    times = protocol.time_alternating(fns, timing)
    rows_ = [{"row": n, "ms": t} for n, t in times.items()]
    rows_ += plan_knobs.ratio_rows(times, [me.replace(":", "/") for me in args.modes.split(",")], list(knobs))
    return {**protocol.header(timing), "shape": protocol.shape_of(args), "causal": not args.non_causal,
            "window": list(args.window),
            "knob": " | ".join(args.knob),
            "max_abs_diff": diffs, "rows": rows_, "proposed_rows": proposed,
            "refused": [{"mode": me, "knob": n, "reason": r} for me, n, r in refused]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p, seqlen=8192, hq=8, hkv=4, headdim=256)
    p.add_argument("--compile-only", action="store_true",
                   help="resolve and compile every row's kernel into the disk cache; no timing, no GPU")
    args, path = plan_knobs.tuning_args(
        p, argv, "fwd", modes="softmax:native,softcap:native,sigmoid:poly", example="num_stages=3",
        knob_help="plan overrides NAME=VALUE[+NAME=VALUE...]: FwdConfig fields (num_stages, tile_n, pingpong, "
                  "row_sum_carry, ...), split=J/K, program=NAME (bench/tools/plan_knobs.py); repeat for more "
                  "variants, each a row beside the default")
    if args.compile_only:
        return compile_only(args)
    res = run(args)
    protocol.report(path, res, protocol.markdown_table(res["rows"], ["row", "ms"]), f"Forward knobs {res['knob']}",
                    shape=plan_knobs.shape_text(args),
                    notes=f"\nMax |default - knob| per row: {res['max_abs_diff']}."
                          + "".join(f"\n- {n}: would justify a FWD_ROWS row when {r['when']} sets {r['sets']}"
                                    if r["sets"] else f"\n- {n}: the default's own config (the noise floor)"
                                    for n, r in res["proposed_rows"].items())
                          + "".join(f"\n- {r['mode']} {r['knob']}: refused ({r['reason']})" for r in res["refused"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
