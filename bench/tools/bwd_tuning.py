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
rounding-level for the FP32 order of dQ's adds otherwise). Causal, BF16, softcap 50.

Knobs (NAME=VALUE joined by '+', bench/tools/plan_knobs.py): BwdConfig fields dq_async, lpt,
head_loop (0 / 1), stages, tile_m, tile_n (int); deterministic (0 / 1: attention()'s, which
also turns off dq_async, lpt and head_loop), zero_dq_in_pre (0 / 1), sigmoid_grad,
softcap_grad (= grad_rule), program (strings), split (the poly column split J/K); fwd.<field>
for the forward of the row.
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


def run(args) -> dict:
    import torch
    from flash_attn_poly.kernels import dispatch
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g)
    q, k, v, do = mk(args.hq), mk(args.hkv), mk(args.hkv), mk(args.hq)
    knobs = {text: parse_knob(text) for text in args.knob}
    fns, diffs = {}, {}
    for me in args.modes.split(","):
        mode, ev = me.split(":")
        kw = dict(causal=True, softcap=50.0 if mode == "softcap" else None)
        grads = {}
        mine = {n: kn for n, kn in knobs.items() if ev == "poly" or not kn.poly_only}
        for name in sorted(set(knobs) - set(mine)):
            print(f"{me}: row '{name}' skipped (split / program / grad rule knobs need a poly evaluator)")
        for name, knob in [("default", None)] + list(mine.items()):
            plan = plan_knobs.plan_for(q, k, v, mode, ev, knob, **kw)
            o, lse = dispatch.forward(plan, q, k, v)
            fn = lambda plan=plan, o=o, lse=lse: dispatch.backward(plan, do, q, k, v, o, lse)
            grads[name] = [x.double() for x in fn()]
            fns[f"{me} {name}"] = fn
        for name in mine:
            rel = max(((a - b).norm() / b.norm()).item() for a, b in zip(grads[name], grads["default"]))
            diffs[f"{me} {name}"] = rel
            print(f"{me}: {name} vs default, max rel L2 over dQ/dK/dV {rel:.2e}", flush=True)
        del grads
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order)
    times = protocol.time_alternating(fns, timing)
    rows = [{"row": n, "ms": t} for n, t in times.items()]
    for me in args.modes.split(","):
        for name in knobs:
            if f"{me} {name}" in times:   # not a skipped poly-only row
                rows.append({"row": f"{me} {name} / default", "ms": times[f"{me} {name}"] / times[f"{me} default"]})
    shape = dict(batch=args.batch, seqlen=args.seqlen, hq=args.hq, hkv=args.hkv, headdim=args.headdim)
    return {**protocol.header(timing), "shape": shape, "knobs": list(knobs), "max_rel_l2_vs_default": diffs,
            "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    p.add_argument("--knob", action="append", default=[],
                   help="plan overrides NAME=VALUE[+NAME=VALUE...] (BwdConfig fields, deterministic, zero_dq_in_pre, "
                        "split, softcap_grad, program; bench/tools/plan_knobs.py); repeat for more rows")
    p.add_argument("--modes", default="softmax:native,softcap:poly,sigmoid:poly")
    p.add_argument("--order", choices=sorted(protocol.ORDERS), default="alternate")
    protocol.add_timing_args(p, warmup=10, rounds=5, iters=20)
    protocol.add_json_arg(p, "bwd_tuning")
    args = p.parse_args(argv)
    if not args.knob:
        p.error("give at least one --knob (e.g. --knob head_loop=0)")
    for text in args.knob:
        try:
            parse_knob(text)
        except ValueError as e:
            p.error(str(e))
    path = protocol.output_path(args.json, "bwd_tuning")
    res = run(args)
    table = protocol.markdown_table(res["rows"], ["row", "ms"])
    print(table)
    protocol.write_results(path, res,
                           f"# Backward knobs {' | '.join(res['knobs'])} ({res['device']}, {res['date']}, "
                           f"commit {res['commit']})\n\nShape: {res['shape']}, causal, BF16, softcap 50. "
                           f"Protocol: {res['protocol']}.\nMax rel L2 vs the default per row: "
                           f"{res['max_rel_l2_vs_default']}.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
