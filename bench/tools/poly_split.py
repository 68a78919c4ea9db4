"""Polynomial program x column split side by side: forward/backward time and accuracy.

    python bench/tools/poly_split.py --only "softcap/softcap_c50_f16_odd 1/8 softcap_grad=value"   # H200

A poly score sends key column group g (8 keys) through the packed block when g % k < j and
through MUFU otherwise (kernels/scores, "Poly split"); the backward recomputes the same P.
Each row is the plan attention(program=...) resolves with the split as a plan override
(bench/tools/plan_knobs.py). A split that cannot repeat inside BF16 softcap's default 64-key
three-warpgroup tile at D = 128 (1/16) names the two-warpgroup 128-key tile in its tuning
(TWO_WG), so compare such rows with that in mind (bench/tools/fwd_tuning.py times tiles side
by side).
Writes bench/out/poly_split.json (+ .md) unless --json names a path.
For each (mode, program, split) and the native evaluator:
  * time: forward and backward (kernels/dispatch; the backward alone, forward excluded) at the gqa_4096 shape
    (B=1 S=4096 H_q=32 H_kv=8 D=128 causal BF16, softcap 50) under bench/protocol.py, every
    row of a direction side by side in one alternating run;
  * accuracy: rel L2 of O, dQ, dK, dV against the FP64 exact-function reference at
    bench/accuracy.py's shape (B=1 S=4096 H_q=8 H_kv=2) and spreads (softcap 3.5 / 4.5:
    scaled-score std ~12 / ~20; sigmoid 1.3 / 1.7), and the ratio to the native row's.
"""
from __future__ import annotations

import argparse
import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import protocol  # noqa: E402

# two consumer warpgroups on 128-key blocks with ping-pong (a poly score's base): a 1/16 split
# repeats every 128 keys, more than BF16 softcap's default 64-key blocks hold (kernels/config.check_fwd)
TWO_WG = "tile_m=128+tile_n=128+num_stages=2+pingpong=1"
CONFIGS = [  # (mode, program or "" for native, split[, knobs "name=value+...", bench/tools/plan_knobs.py])
    ("softcap", "", None),
    ("softcap", "softcap_c50", (1, 2)), ("softcap", "softcap_c50", (1, 4)),
    ("softcap", "softcap_c50_f16", (1, 2)), ("softcap", "softcap_c50_f16", (1, 4)),
    ("softcap", "softcap_c50_f16", (1, 8)), ("softcap", "softcap_c50_f16", (1, 16), TWO_WG),
    ("sigmoid", "", None),
    ("sigmoid", "sigmoid_attn_n4096", (1, 4)), ("sigmoid", "sigmoid_attn_n4096", (1, 8)),
    ("sigmoid", "sigmoid_attn_n4096_f16", (1, 4)), ("sigmoid", "sigmoid_attn_n4096_f16", (1, 8)),
    # one block column group in 16 (docs/MEASURED.md): BF16 1/8 was the one poly row faster
    # than native in the forward (0.231 vs 0.235 ms) but 2.0-2.1x native's error
    ("sigmoid", "sigmoid_attn_n4096", (1, 16)), ("sigmoid", "sigmoid_attn_n4096_f16", (1, 16)),
    # two-region FP16 softcap at the narrow splits
    ("softcap", "softcap_c50_f16_tail", (1, 8)), ("softcap", "softcap_c50_f16_tail", (1, 16), TWO_WG),
    # the backward's d logit/dx from the block's logit (the softcap score's grad_rule "value") vs
    # the derivative block ("block")
    ("softcap", "softcap_c50_f16", (1, 8), "softcap_grad=value"),
    ("softcap", "softcap_c50_f16_tail", (1, 16), TWO_WG + "+softcap_grad=value"),
    ("softcap", "softcap_c50_f16_tail", (1, 8), "softcap_grad=value"),
    ("softcap", "softcap_c50_f16", (1, 8), "softcap_grad=block"),
    ("softcap", "softcap_c50_f16_tail", (1, 16), TWO_WG + "+softcap_grad=block"),
    # the one-region program on 1/16 with the value rule
    ("softcap", "softcap_c50_f16", (1, 16), TWO_WG + "+softcap_grad=value"),
    # the odd_u2 program (fit/softcap_odd.py: clamp on the FMA pipe, no ALU ops in the block):
    # does a wider split pay?
    ("softcap", "softcap_c50_f16_odd", (1, 16), TWO_WG + "+softcap_grad=value"),
    ("softcap", "softcap_c50_f16_odd", (1, 8), "softcap_grad=value"),
    ("softcap", "softcap_c50_f16_odd", (1, 4), "softcap_grad=value"),
    ("softcap", "softcap_c50_f16_odd", (1, 2), "softcap_grad=value"),
]
SPREADS = {"softcap": (3.5, 4.5), "sigmoid": (1.3, 1.7)}


def _name(mode, prog, split, tuning=""):
    base = f"{mode}/native" if not prog else f"{mode}/{prog} {split[0]}/{split[1]}"
    return f"{base} {tuning}" if tuning else base


def knob(prog: str, split, tuning: str = ""):
    """The plan_knobs.Knob of a config: its program and split, then its tuning's knobs."""
    import plan_knobs
    k = plan_knobs.parse(tuning, "fwd") if tuning else plan_knobs.Knob("")
    if not prog:
        return k
    return plan_knobs.Knob(tuning, {**k.overrides, "poly_split": tuple(split)}, {**k.call, "program": prog})


def _calls(mode, prog, split, q, k, v, do, tuning=""):
    """(forward, backward) callables of one config on fixed inputs."""
    import plan_knobs
    from flash_attn_poly.kernels import dispatch
    ev = "poly" if prog else "native"
    plan = plan_knobs.plan_for(q, k, v, mode, ev, knob(prog, split, tuning), causal=True,
                               softcap=50.0 if mode == "softcap" else None)
    fwd = lambda: dispatch.forward(plan, q, k, v)
    o, lse = fwd()
    bwd = lambda: dispatch.backward(plan, do, q, k, v, o, lse)
    return fwd, bwd


def accuracy(mode, prog, split, spread, shape, tuning=""):
    import torch
    from flash_attn_poly.reference import attention_ref, attention_ref_backward
    from flash_attn_poly.testing import rel_l2_err
    b, s, hq, hkv, d = shape
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{mode} {spread}".encode()))
    mk = lambda h, a: (torch.randn(b, s, h, d, device="cuda", generator=g) * a).to(torch.bfloat16)
    q, k, v, do = mk(hq, spread), mk(hkv, spread), mk(hkv, 1.0), mk(hq, 1.0)
    fwd, bwd = _calls(mode, prog, split, q, k, v, do, tuning)
    out = fwd()[0]
    grads = bwd()
    kw = {"softcap": 50.0} if mode == "softcap" else {}
    ref, _ = attention_ref(q, k, v, mode, causal=True, **kw)
    ref_g = attention_ref_backward(do, q, k, v, mode, causal=True, **kw)
    errs = {"O": rel_l2_err(out, ref)}
    errs.update({n: rel_l2_err(x, r) for n, x, r in zip(("dQ", "dK", "dV"), grads, ref_g)})
    return errs


def run(args) -> dict:
    import torch
    b, s, hq, hkv, d = 1, 4096, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, do = mk(hq), mk(hkv), mk(hkv), mk(hq)
    configs = [c for c in CONFIGS if c[0] in args.modes.split(",")]
    if args.only:   # the named configs, plus each mode's native row (the ratios' reference)
        keep = set(args.only.split(","))
        configs = [c for c in configs if _name(*c) in keep or (not c[1] and len(c) == 3)]
    calls = {_name(*c): _calls(*c[:3], q, k, v, do, *c[3:]) for c in configs}
    timing = protocol.Timing(args.warmup, args.rounds, args.iters)
    fwd = protocol.time_alternating({n: f for n, (f, _) in calls.items()}, timing)
    bwd = protocol.time_alternating({n: bw for n, (_, bw) in calls.items()}, timing)
    rows = []
    for c in configs:
        n = _name(*c)
        row = {"config": n, "mode": c[0], "program": c[1], "split": None if c[2] is None else f"{c[2][0]}/{c[2][1]}",
               "tuning": c[3] if len(c) > 3 else "", "fwd_ms": fwd[n], "bwd_ms": bwd[n]}
        for sp in SPREADS[c[0]]:
            e = accuracy(*c[:3], sp, (1, 4096, 8, 2, 128), *c[3:])
            row.update({f"{x}@{sp}": e[x] for x in e})
            torch.cuda.empty_cache()
        rows.append(row)
        print(n, {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    native = {r["mode"]: r for r in rows if not r["program"] and not r["tuning"]}
    for r in rows:
        nat = native[r["mode"]]
        for sp in SPREADS[r["mode"]]:
            r[f"/native@{sp}"] = " / ".join(f"{r[f'{x}@{sp}'] / nat[f'{x}@{sp}']:.2f}" for x in ("O", "dQ", "dK", "dV"))
    hdr = protocol.header(timing)
    hdr["protocol"] = ("time: " + hdr["protocol"] + "; forward and backward each one alternating run, B=1 S=4096 "
                       "H_q=32 H_kv=8 D=128 causal BF16; accuracy: one call per spread, B=1 S=4096 H_q=8 H_kv=2, "
                       "rel L2 vs FP64 exact-function reference")
    return {**hdr, "rows": rows}


def markdown(res) -> str:
    lines = [f"# Poly program x split ({res['device']}, {res['date']}, commit {res['commit']})", "",
             f"Protocol: {res['protocol']}.", "", protocol.doc_body(__doc__), "",
             "`/native@s`: O / dQ / dK / dV error of the row divided by the native row's, at spread s."]
    for mode in ("softcap", "sigmoid"):   # one table per mode run (their spreads differ)
        rows = [r for r in res["rows"] if r["mode"] == mode]
        if rows:
            cols = ["config", "fwd_ms", "bwd_ms"] + [c for c in rows[0] if c.startswith("/native@")]
            lines += ["", protocol.markdown_table(rows, cols)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="softcap,sigmoid")
    protocol.add_timing_args(p, warmup=25, rounds=5, iters=100)
    p.add_argument("--only", default="", help="comma-separated config names (as printed, e.g. "
                   "'softcap/softcap_c50_f16_tail 1/8'); each mode's native row always runs")
    protocol.add_json_arg(p, "poly_split")
    args = p.parse_args(argv)
    path = protocol.output_path(args.json, "poly_split")
    res = run(args)
    md = markdown(res)
    protocol.write_results(path, res, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
