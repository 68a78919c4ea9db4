"""Forward tuning knobs side by side at one shape: the default config vs overrides.

    python bench/tools/fwd_tuning.py --headdim 256 --seqlen 8192 --hq 8 --hkv 4 --knob num_stages=3 \
        --modes softmax:native,softcap:native,sigmoid:poly      # H200

For every mode:evaluator, a `default` row (the config attn_fwd builds for that head dim) and
one row per `--knob` (the same with the override, e.g. num_stages=3 or pingpong=0) run side
by side under bench/protocol.py. Before timing, both outputs are computed on the same inputs
and their max abs difference printed (0 for knobs that change CTA order or pipelining, not
arithmetic). Causal, BF16, softcap 50. Writes bench/out/fwd_tuning.json (+ .md) unless --json.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import protocol  # noqa: E402


BOOL_KNOBS = ("pingpong", "row_sum_carry", "fixed_max")
FLOAT_KNOBS = ("rescale_threshold",)
STR_KNOBS = ()
STAGE_KNOBS = ("split", "program")   # not AttnFwdConfig fields: the poly stage's column split,
                                     # 'split=J/K', and its coefficient-table program


def _knob(text: str) -> dict:
    """'name=int' or several joined by '+', e.g. 'row_sum_carry=1+pingpong=1' (AttnFwdConfig
    fields; BOOL_KNOBS as 0 / 1, FLOAT_KNOBS as floats; split the poly stage's column split:
    'split=1/8', program its coefficient-table entry)."""
    out = {}
    for part in text.split("+"):
        k, v = part.split("=")
        out[k] = (bool(int(v)) if k in BOOL_KNOBS else float(v) if k in FLOAT_KNOBS
                  else v if k in STR_KNOBS + STAGE_KNOBS else int(v))
    return out


def _stage(mode: str, ev: str, tuning: dict):
    """Pops the stage knobs out of tuning; the stage they ask for, or None (attn_fwd's default).
    A program without a split takes the default split for the knob's key block."""
    split = tuning.pop("split", None) if tuning else None
    program = tuning.pop("program", None) if tuning else None
    if split is None and program is None:
        return None
    if ev != "poly":
        raise ValueError(f"split / program knobs need a poly evaluator, got {mode}:{ev}")
    from flash_attn_poly.kernels import score_stages as S
    kw = {"program": program} if program else {}
    if split is not None:
        kw["poly_split"] = tuple(int(x) for x in split.split("/"))
    return S.make_stage(mode, ev, key_block=tuning.get("tile_n", 128), **kw)


def run(args) -> dict:
    import torch
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g)
    q, k, v = mk(args.hq), mk(args.hkv), mk(args.hkv)
    knobs = args.knob
    fns, diffs = {}, {}
    for me in args.modes.split(","):
        mode, ev = me.split(":")
        kw = dict(mode=mode, evaluator=ev, causal=True, softcap=50.0 if mode == "softcap" else None)
        outs = {}
        mine = [kn for kn in knobs if ev == "poly" or not set(STAGE_KNOBS) & set(_knob(kn))]
        for kn in sorted(set(knobs) - set(mine)):
            print(f"{me}: row '{kn}' skipped (split / program knobs need a poly evaluator)")
        for name, tuning in [("default", None)] + [(kn, _knob(kn)) for kn in mine]:
            stage = _stage(mode, ev, tuning)
            fn = lambda tuning=tuning or None, kw=kw, stage=stage: attn_fwd(q, k, v, tuning=tuning, stage=stage, **kw)
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
        for kn in knobs:
            if f"{mode}/{ev} {kn}" not in times:   # a poly-only row
                continue
            a, b = times[f"{mode}/{ev} default"], times[f"{mode}/{ev} {kn}"]
            rows.append({"row": f"{mode}/{ev} {kn} / default", "ms": b / a})
    shape = dict(batch=args.batch, seqlen=args.seqlen, hq=args.hq, hkv=args.hkv, headdim=args.headdim)
    return {**protocol.header(timing), "shape": shape, "knob": " | ".join(knobs), "max_abs_diff": diffs, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p, seqlen=8192, hq=8, hkv=4, headdim=256)
    p.add_argument("--knob", action="append", default=[],
                   help="AttnFwdConfig override NAME=INT[+NAME=INT...] (num_stages, tile_n, pingpong, "
                        "row_sum_carry, ...); repeat for more variants, each a row beside the default")
    p.add_argument("--order", choices=sorted(protocol.ORDERS), default="alternate")
    p.add_argument("--modes", default="softmax:native,softcap:native,sigmoid:poly")
    protocol.add_timing_args(p, warmup=10, rounds=5, iters=20)
    protocol.add_json_arg(p, "fwd_tuning")
    args = p.parse_args(argv)
    if not args.knob:
        p.error("give at least one --knob (e.g. --knob num_stages=3)")
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
