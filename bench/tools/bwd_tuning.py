"""Backward tuning knobs side by side at one shape: the plan's backward vs overrides.

    python bench/tools/bwd_tuning.py --knob head_loop=0 --knob lpt=0 \
        --modes softmax:native,softcap:poly,sigmoid:poly       # H200

The counterpart of bench/tools/fwd_tuning.py for the backward (kernels/dispatch.backward).
For every mode:evaluator, a `default` row (the plan attention() resolves for the shape) and one
row per `--knob` (the plan with overrides) run side by side under bench/protocol.py; each row
is the backward alone (pre/post-processing included, the forward excluded; O and LSE from the
row's own forward, which differs from the default's only for program / split knobs). Before
timing, both rows' gradients on the same inputs are compared: max rel L2 over dQ / dK / dV,
printed and stored (0 for knobs that only reorder work in a deterministic build,
rounding-level for the FP32 order of dQ's adds otherwise). Causal (or --non-causal), BF16,
softcap 50; a knob row no kernel builds is skipped with the reason.

Knobs (NAME=VALUE joined by '+', bench/tools/plan_knobs.py): BwdConfig fields dq_async, lpt,
head_loop, kv_sections, dkv_smem, dq_halves (0 / 1), stages, tile_m, tile_n (int); deterministic (0 / 1: attention()'s, which
also turns off dq_async, lpt and head_loop), zero_dq_in_pre (0 / 1), sigmoid_grad,
softcap_grad (= grad_rule), program (strings), split (the poly column split J/K); fwd.<field>
for the forward of the row.

--compile-only resolves every row's plan and compiles its forward and backward kernels into the
disk compile cache without a GPU (as bench/tools/fwd_tuning.py's): on the device machine a
parallel pre-build of several cells while something else holds the GPU, so the timed run loads.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import plan_knobs  # noqa: E402
import protocol  # noqa: E402

def parse_knob(text: str):
    """'head_loop=0+lpt=1' -> the plan_knobs.Knob of the backward's fields."""
    return plan_knobs.parse(text, "bwd")


def compile_only(args) -> int:
    """Resolve and compile every row's forward and backward kernel (no timing, no GPU needed);
    a knob row no kernel builds is skipped with the reason, as in the timed run."""
    q, k, v = plan_knobs.inputs(args, 3, "meta")
    knobs = {text: parse_knob(text) for text in args.knob}
    refused = []
    plans = list(plan_knobs.each_plan(q, k, v, args.modes, knobs, refused,
                                      causal=not args.non_causal, window=args.window))
    n = plan_knobs.compile_plans(plans, backward=True)
    print(f"{n} builds, {len(refused)} knob rows refused")
    return 0


def run(args) -> dict:
    from flash_attn_poly.kernels import dispatch
    q, k, v, do = plan_knobs.inputs(args, 4)
    knobs = {text: parse_knob(text) for text in args.knob}
    fns, diffs = {}, {}
    refused = []
    for me, name, plan in plan_knobs.each_plan(q, k, v, args.modes, knobs, refused,
                                               causal=not args.non_causal, window=args.window):
        o, lse = dispatch.forward(plan, q, k, v)
        fn = lambda plan=plan, o=o, lse=lse: dispatch.backward(plan, do, q, k, v, o, lse)
        grads = [x.double() for x in fn()]
        fns[f"{me} {name}"] = fn
        if name == "default":
            default = grads
        else:
            rel = max(((a - b).norm() / b.norm()).item() for a, b in zip(grads, default))
            diffs[f"{me} {name}"] = rel
            print(f"{me}: {name} vs default, max rel L2 over dQ/dK/dV {rel:.2e}", flush=True)
    del grads, default
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order)
    times = protocol.time_alternating(fns, timing)
    rows = [{"row": n, "ms": t} for n, t in times.items()]
    rows += plan_knobs.ratio_rows(times, args.modes.split(","), list(knobs))
    return {**protocol.header(timing), "shape": protocol.shape_of(args), "causal": not args.non_causal,
            "window": list(args.window),
            "knobs": list(knobs), "max_rel_l2_vs_default": diffs, "rows": rows,
            "refused": [{"mode": me, "knob": n, "reason": r} for me, n, r in refused]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    p.add_argument("--compile-only", action="store_true",
                   help="resolve and compile every row's kernels into the disk cache; no timing, no GPU")
    args, path = plan_knobs.tuning_args(
        p, argv, "bwd", modes="softmax:native,softcap:poly,sigmoid:poly", example="head_loop=0",
        knob_help="plan overrides NAME=VALUE[+NAME=VALUE...] (BwdConfig fields, deterministic, zero_dq_in_pre, "
                  "split, softcap_grad, program; bench/tools/plan_knobs.py); repeat for more rows")
    if args.compile_only:
        return compile_only(args)
    res = run(args)
    protocol.report(path, res, protocol.markdown_table(res["rows"], ["row", "ms"]),
                    f"Backward knobs {' | '.join(res['knobs'])}",
                    shape=plan_knobs.shape_text(args, ", softcap 50"),
                    notes=f"\nMax rel L2 vs the default per row: {res['max_rel_l2_vs_default']}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
