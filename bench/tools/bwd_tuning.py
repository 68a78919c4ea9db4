"""Backward tuning knobs side by side at one shape: attn_bwd's defaults vs overrides.

    python bench/tools/bwd_tuning.py --knob head_loop=0 --knob lpt=0 \
        --modes softmax:native,softcap:poly,sigmoid:poly       # H200

The counterpart of bench/tools/fwd_tuning.py for kernels/attn_bwd_sm90.attn_bwd. For every
mode:evaluator, a `default` row (attn_bwd with no keyword: the defaults it resolves for the
shape) and one row per `--knob` run side by side under bench/protocol.py; each row is the
backward alone (pre/post-processing included, the forward excluded). Before timing, both
rows' gradients on the same inputs (O and LSE from attn_fwd) are compared: max rel L2 over
dQ / dK / dV, printed and stored (0 for knobs that only reorder work in a deterministic
build, rounding-level for the FP32 order of dQ's adds otherwise). Causal, BF16, softcap 50.

Knobs (attn_bwd keywords, NAME=VALUE joined by '+'): deterministic, dq_async, lpt,
head_loop, zero_dq_in_pre (0 / 1), stages (int), sigmoid_grad, softcap_grad, program
(strings), split (the poly column split J/K).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import protocol  # noqa: E402

BOOL_KNOBS = ("deterministic", "dq_async", "lpt", "head_loop", "zero_dq_in_pre")
INT_KNOBS = ("stages",)
STR_KNOBS = ("sigmoid_grad", "softcap_grad", "program")


def parse_knob(text: str) -> dict:
    """'head_loop=0+lpt=1' -> attn_bwd keywords; 'split=1/8' -> poly_split=(1, 8)."""
    out = {}
    for part in text.split("+"):
        name, sep, value = part.partition("=")
        if not sep or not value:
            raise ValueError(f"--knob {text!r}: expected NAME=VALUE[+NAME=VALUE...], got {part!r}")
        if name in BOOL_KNOBS:
            if value not in ("0", "1"):
                raise ValueError(f"--knob {name}: expected 0 or 1, got {value!r}")
            out[name] = value == "1"
        elif name in INT_KNOBS:
            out[name] = int(value)
        elif name in STR_KNOBS:
            out[name] = value
        elif name == "split":
            j, _, k = value.partition("/")
            out["poly_split"] = (int(j), int(k))
        else:
            raise ValueError(f"--knob {name}: unknown; known: "
                             f"{', '.join(BOOL_KNOBS + INT_KNOBS + STR_KNOBS + ('split',))}")
    return out


def run(args) -> dict:
    import torch
    from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g)
    q, k, v, do = mk(args.hq), mk(args.hkv), mk(args.hkv), mk(args.hq)
    knobs = {text: parse_knob(text) for text in args.knob}
    fns, diffs = {}, {}
    for me in args.modes.split(","):
        mode, ev = me.split(":")
        kw = dict(mode=mode, evaluator=ev, causal=True, softcap=50.0 if mode == "softcap" else None)
        o, lse = attn_fwd(q, k, v, **kw)
        grads = {}
        for name, extra in [("default", {})] + list(knobs.items()):
            fn = lambda extra=extra, kw=kw, o=o, lse=lse: attn_bwd(do, q, k, v, o, lse, **kw, **extra)
            grads[name] = [x.double() for x in fn()]
            fns[f"{me} {name}"] = fn
        for name in knobs:
            rel = max(((a - b).norm() / b.norm()).item() for a, b in zip(grads[name], grads["default"]))
            diffs[f"{me} {name}"] = rel
            print(f"{me}: {name} vs default, max rel L2 over dQ/dK/dV {rel:.2e}", flush=True)
        del grads
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order)
    times = protocol.time_alternating(fns, timing)
    rows = [{"row": n, "ms": t} for n, t in times.items()]
    for me in args.modes.split(","):
        for name in knobs:
            rows.append({"row": f"{me} {name} / default", "ms": times[f"{me} {name}"] / times[f"{me} default"]})
    shape = dict(batch=args.batch, seqlen=args.seqlen, hq=args.hq, hkv=args.hkv, headdim=args.headdim)
    return {**protocol.header(timing), "shape": shape, "knobs": list(knobs), "max_rel_l2_vs_default": diffs,
            "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    p.add_argument("--knob", action="append", default=[],
                   help="attn_bwd keywords NAME=VALUE[+NAME=VALUE...]; repeat for more rows beside the default")
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
