"""Per-CTA fixed cost of the forward: time vs key length at a fixed grid, non-causal.

    python bench/tools/cta_overhead.py          # H200: bench/out/cta_overhead.json (+ .md)

With S_q fixed (B=1, S_q=4096, H 32/8, D=128: 32 x 32 = 1024 CTAs, every CTA the same work
without a causal mask), the forward's device time is waves x (c0 + n x t_block), n = S_k /
tile_n key blocks per CTA. A least-squares line through the times at several S_k gives the
slope (time per key block per wave) and the intercept; intercept / waves estimates c0, what
one CTA costs besides its key blocks (launch, barrier/TMA set-up, the Q and first K/V load
latency, the epilogue). A persistent kernel could hide part of c0; this measures whether it
is worth building. Rows are CUDA-graph device time (bench/protocol.py GRAPH_PROTOCOL).
FA4 softmax (non-causal, same shapes) runs as a row when flash-attn-4 is installed.
`--knob persistent=0` adds each mode again with that plan override (FwdConfig field=value,
bench/tools/plan_knobs.py): with the persistent grid (the default) the intercept / waves
reads as the fixed cost per tile that the persistent CTAs did not hide (a CTA walks `waves`
tiles in a row).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import plan_knobs  # noqa: E402
import protocol  # noqa: E402


def fit_line(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    icpt = my - slope * mx
    resid = max(abs(y - (icpt + slope * x)) for x, y in zip(xs, ys))
    return slope, icpt, resid


def run(args) -> dict:
    import torch
    from flash_attn_poly.kernels import dispatch
    try:
        from flash_attn.cute import flash_attn_func
    except ImportError:
        flash_attn_func = None
        print("flash-attn-4 not installed: no FA4 rows")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(args.batch, args.seqlen, args.hq, args.headdim, device="cuda", dtype=torch.bfloat16, generator=g)
    sks = [int(s) for s in args.sk.split(",")]
    kv = {s: [torch.randn(args.batch, s, args.hkv, args.headdim, device="cuda", dtype=torch.bfloat16, generator=g)
              for _ in range(2)] for s in sks}
    impls = {}   # name -> {s_k: forward callable}
    knobs = [None] + [plan_knobs.parse(kn, "fwd") for kn in (args.knob or [])]
    for me in args.modes.split(","):
        mode, ev = me.split(":")
        for kn in knobs:
            tag = "" if kn is None else " " + kn.text
            plans = {s: plan_knobs.plan_for(q, *kv[s], mode, ev, kn, causal=False,
                                            softcap=50.0 if mode == "softcap" else None) for s in sks}
            impls[f"ours {mode}/{ev}{tag}"] = {
                s: (lambda p=plans[s], s=s: dispatch.forward(p, q, *kv[s])) for s in sks}
    if flash_attn_func is not None:
        impls["fa4 softmax"] = {s: (lambda s=s: flash_attn_func(q, *kv[s], causal=False)) for s in sks}
    fns = {f"{name} sk={s}": f[s] for name, f in impls.items() for s in sks}
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, "shuffle")
    times = protocol.time_alternating_graph(fns, timing)
    ctas = math.ceil(args.seqlen / 128) * args.hq * args.batch
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    waves = math.ceil(ctas / sms)
    rows, fits = [], []
    for name in impls:
        xs = [s / 128 for s in sks]
        ys = [times[f"{name} sk={s}"] * 1000 for s in sks]      # us
        for s, y in zip(sks, ys):
            rows.append({"impl": name, "s_k": s, "us": round(y, 2)})
        slope, icpt, resid = fit_line(xs, ys)
        fits.append({"impl": name, "us_per_block_per_wave": round(slope / waves, 3),
                     "intercept_us": round(icpt, 2), "c0_us_per_cta": round(icpt / waves, 3),
                     "c0_share_at_sk4096": round(icpt / ys[-1], 4), "max_resid_us": round(resid, 2)})
    shape = dict(batch=args.batch, seqlen_q=args.seqlen, hq=args.hq, hkv=args.hkv, headdim=args.headdim,
                 causal=False, ctas=ctas, sms=sms, waves=waves, s_k=sks)
    graph_protocol = protocol.GRAPH_PROTOCOL.format(warmup=args.warmup, iters=args.iters, rounds=args.rounds)
    graph_protocol = graph_protocol.replace("alternating between rounds (listed, reversed)", "shuffled each round (seeded)")
    return {**protocol.header(timing), "graph_protocol": graph_protocol, "shape": shape,
            "rows": rows, "fits": fits}


def markdown(res: dict) -> str:
    out = [f"# Per-CTA fixed cost of the forward ({res['device']}, {res['date']}, commit {res['commit']})", "",
           protocol.doc_body(__doc__), "", f"Shape: {res['shape']}", "", f"Protocol: {res['graph_protocol']}", "",
           protocol.markdown_table(res["rows"], ["impl", "s_k", "us"]), "",
           protocol.markdown_table(res["fits"], ["impl", "us_per_block_per_wave", "intercept_us",
                                                 "c0_us_per_cta", "c0_share_at_sk4096", "max_resid_us"])]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)   # --seqlen is S_q
    p.add_argument("--sk", default="512,1024,2048,3072,4096")
    p.add_argument("--modes", default="softmax:native,sigmoid:native,softcap:native,softcap:poly")
    p.add_argument("--knob", action="append",
                   help="plan overrides NAME=VALUE[+NAME=VALUE] (bench/tools/plan_knobs.py), rows beside the default")
    protocol.add_timing_args(p, warmup=5, rounds=7, iters=50)
    protocol.add_json_arg(p, "cta_overhead")
    args = p.parse_args(argv)
    path = protocol.output_path(args.json, "cta_overhead")
    res = run(args)
    for f in res["fits"]:
        print(f)
    protocol.write_results(path, res, markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
