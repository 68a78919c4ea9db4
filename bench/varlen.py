"""Variable-length attention benchmark (issue 28, item 4): ours varlen vs dense, FA4 varlen, padding.

    python bench/varlen.py                         # H200: both scenarios, every mode, fwd and bwd
    python bench/varlen.py --scenario ragged --modes softmax,softcap --order shuffle --rounds 9
    python bench/varlen.py --list                  # CPU: the length lists and rows, nothing timed

Causal, BF16, H_q = 32, H_kv = 8, D = 128 (Gemma-2's softcap 50 for mode softcap).  Every row is
timed side by side in one run with the protocol in bench/protocol.py; forward and backward
separately (backward: `torch.autograd.grad` on a retained graph, forward excluded).  Results go
to bench/out/varlen.json and the Markdown beside it; `--json bench/results/varlen.json` commits one.

Rows "ours_varlen" run attention_varlen as the plan picks: the varlen kernels (a persistent forward
over (sequence, head) units, and a backward with a CTA per key tile, head and sequence), every mode (sigmoid at
its default bias adds each sequence's -ln S_k in the kernels).
Rows "ours_varlen_nocheck": the same call with check_inputs=False (no device-to-host copy of the
offsets, as flash-attn's varlen and our transformers integration call it): the kernels' own cost,
the row to hold against the dense call and FA4.
Rows "ours_varlen_knob" (forward only; every mode; only with --fwd-knob NAME=VALUE[+...]): the
varlen forward with those FwdConfig overrides (e.g. `--fwd-knob o_smem=1`), input check skipped; ratios
keyed "knob:<baseline>/...", one of them against ours_varlen_nocheck: the candidate for a varlen plan row.
Rows "ours_varlen_bknob" (backward only; every mode; only with --bwd-knob NAME=VALUE[+...]): the
varlen backward with those BwdConfig overrides (e.g. `--bwd-knob dq_halves=1`), the backward alone on
the plan's forward outputs; ratios "bknob:<baseline>/...", one against ours_varlen_nocheck.
(The compact forward order and the per-KV-head backward, once rows here, are plan defaults now:
`--fwd-knob varlen_compact=0` / `--bwd-knob head_loop=0` time their alternatives; the backward's table
order follows the lengths, block on equal ones, unit on ragged ones: `--bwd-knob varlen_order=unit|block`.)

Scenarios.  "equal": B sequences of one length L (default 8 x 4096); rows: ours varlen, ours
dense on (B, L, H, D) (the same tokens: varlen's overhead, goal <= 3%).  "ragged": lengths
drawn from a long-tailed distribution (lognormal, median 1k, clipped to [1, 16k], drawn until
the total reaches --tokens, default 32k; seeded); rows: ours varlen, FA4's varlen
(flash_attn.cute.flash_attn_varlen_func; skipped, saying so, when not installed), and ours dense
on the batch padded to its longest sequence (what a padded batch costs; TFLOP/s count only the
real tokens' causal work).  Ratios: dense / varlen (equal), fa4 / ours and padded / ours (ragged).

Our varlen call reads the offsets on the host (one device-to-host copy per call): its rows
include that sync, and they cannot be captured in a CUDA graph, so there are no graph rows.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(_HERE, "tools")]   # protocol; plan_knobs (--fwd-knob, --bwd-knob)
import protocol  # noqa: E402

SOFTCAP = 50.0
MODES = ("softmax", "softcap", "sigmoid")


def ragged_lengths(tokens: int, seed: int = 0, median: int = 1024, sigma: float = 1.2,
                   cap: int = 16384) -> list[int]:
    """Lognormal lengths (a long tail, as real fine-tuning batches have) until the total reaches
    `tokens`; the last one is cut so the total is exactly `tokens`."""
    import numpy as np
    rng = np.random.default_rng(seed)
    lens, total = [], 0
    while total < tokens:
        n = int(min(cap, max(1, round(median * float(np.exp(sigma * rng.standard_normal()))))))
        n = min(n, tokens - total)
        lens.append(n)
        total += n
    return lens


def causal_flops(lens: list[int], hq: int, d: int, backward: bool) -> float:
    """Causal attention's FLOPs of the real tokens (4 S^2 H D / 2 per sequence; backward 2.5x)."""
    f = sum(4 * hq * n * n * d / 2 for n in lens)
    return f * (2.5 if backward else 1.0)


def _cu(lens, device="cuda"):
    import torch
    return torch.tensor([0] + list(__import__("itertools").accumulate(lens)), dtype=torch.int32, device=device)


def _mode_kw(mode):
    return {"softcap": SOFTCAP} if mode == "softcap" else {}


def rows_for(scenario: str, modes, evaluators, knob: bool = False, bknob: bool = False) -> list[tuple[str, str, str]]:
    """(impl, mode, evaluator) of every row (knob / bknob: the --fwd-knob / --bwd-knob rows too)."""
    impls = ("ours_varlen", "ours_varlen_nocheck") + (("ours_varlen_knob",) if knob else ()) + (
        ("ours_varlen_bknob",) if bknob else ()) + (
        ("ours_dense",) if scenario == "equal" else ("fa4_varlen", "ours_padded"))
    out = []
    for mode in modes:
        for impl in impls:
            evs = evaluators if impl.startswith("ours") else ("native",)
            if impl == "fa4_varlen" and mode == "sigmoid":
                continue   # FA4 has no sigmoid attention
            out += [(impl, mode, ev) for ev in evs]
    return out


def make_row(impl, mode, evaluator, lens, args) -> Optional[Callable[[bool], tuple]]:
    """A function requires_grad -> (forward callable, leaf tensors); None if unavailable."""
    import torch
    import flash_attn_poly as fap
    hq, hkv, d = args.hq, args.hkv, args.headdim
    total, mx, b = sum(lens), max(lens), len(lens)
    cu = _cu(lens)
    kw = _mode_kw(mode)

    def packed(rg):
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda h: torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(rg)
        return mk(hq), mk(hkv), mk(hkv)

    if impl in ("ours_varlen", "ours_varlen_nocheck"):
        check = impl == "ours_varlen"

        def build(rg):
            q, k, v = packed(rg)
            return (lambda: fap.attention_varlen(q, k, v, cu, cu, mx, mx, mode, evaluator=evaluator,
                                                 check_inputs=check, **kw)), (q, k, v)
        return build
    if impl == "ours_varlen_knob":   # the varlen forward with plan overrides, forward only
        from flash_attn_poly import varlen as fv
        over = dict({"fwd.varlen": True}, **args.fwd_overrides)

        def build(rg):
            if rg:
                return None
            q, k, v = packed(rg)
            call = fv.validate(q, k, v, cu, cu, mx, mx, mode, evaluator, True, kw.get("softcap"), None, None,
                               (-1, -1))
            return (lambda: fv._forward(q, k, v, cu, cu, call, False, "cuda", overrides=over)), (q, k, v)
        return build
    if impl == "ours_varlen_bknob":   # the varlen backward with plan overrides, backward only
        import torch
        from flash_attn_poly import varlen as fv

        def build(rg):
            if not rg:
                return None
            q, k, v = (t.detach() for t in packed(False))
            call = fv.validate(q, k, v, cu, cu, mx, mx, mode, evaluator, True, kw.get("softcap"), None, None,
                               (-1, -1))
            out, lse = fv._forward(q, k, v, cu, cu, call, False, "cuda")
            dout = torch.randn_like(out)
            over = dict({"bwd.varlen": True}, **args.bwd_overrides)
            return (lambda: fv._backward(dout, q, k, v, cu, cu, out, lse, call, "cuda", overrides=over)), None
        return build
    if impl == "fa4_varlen":
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except Exception as e:  # noqa: BLE001 - any import failure means the baseline is absent
            print(f"skip FA4 varlen {mode}: flash-attn-4 not importable ({type(e).__name__}: {e})")
            return None

        def build(rg):
            q, k, v = packed(rg)
            return (lambda: flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx,
                                                   max_seqlen_k=mx, causal=True,
                                                   softcap=kw.get("softcap", 0.0))), (q, k, v)
        return build
    # dense: equal lengths as (B, L, H, D); padded: (B, max, H, D)
    def build(rg):
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda h: torch.randn(b, mx, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(rg)
        q, k, v = mk(hq), mk(hkv), mk(hkv)
        return (lambda: fap.attention(q, k, v, mode, evaluator=evaluator, **kw)), (q, k, v)
    return build


def _first(x):
    return x[0] if isinstance(x, tuple) else x


def _prepare(builders: dict, backward: bool) -> dict:
    import torch
    fns = {}
    for key, build in builders.items():
        try:
            built = build(backward)
            if built is None:      # a forward-only row
                continue
            fwd, leaves = built
            if leaves is None:     # a backward timed directly (no autograd graph)
                fwd()
                fns[key] = fwd
            elif not backward:
                with torch.no_grad():
                    fwd()
                fns[key] = lambda fwd=fwd: torch.no_grad()(fwd)()
            else:
                out = _first(fwd())
                dout = torch.randn_like(out)
                fns[key] = lambda out=out, leaves=leaves, dout=dout: torch.autograd.grad(
                    out, leaves, dout, retain_graph=True)
                fns[key]()
        except Exception as e:  # noqa: BLE001 - report and keep benchmarking the rest
            print(f"skip {key} {'bwd' if backward else 'fwd'}: {type(e).__name__}: {str(e)[:200]}")
    return fns


def parse_knob(text: str, direction: str = "fwd") -> dict:
    """'o_smem=1+num_stages=3' -> the plan overrides {"fwd.o_smem": True, "fwd.num_stages": 3}
    (bench/tools/plan_knobs.py: FwdConfig fields typed, unknown names refused by name); direction
    "bwd": BwdConfig's ('dq_halves=1' -> {"bwd.dq_halves": True})."""
    import plan_knobs   # bench/tools, on the path below
    return dict(plan_knobs.parse(text, direction).overrides) if text else {}


def lengths_for(args) -> list[int]:
    if args.scenario == "equal":
        return [args.seqlen] * args.batch
    return ragged_lengths(args.tokens, args.seed)


def run(args) -> dict:
    lens = lengths_for(args)
    rows = rows_for(args.scenario, args.modes.split(","), args.evaluators.split(","), bool(args.fwd_knob),
                    bool(args.bwd_knob) and not args.fwd_only)
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order, args.settle_ms)
    builders = {}
    for impl, mode, ev in rows:
        b = make_row(impl, mode, ev, lens, args)
        if b is not None:
            builders[f"{impl}/{mode}/{ev}"] = b
    fwd = protocol.time_alternating(_prepare(builders, False), timing)
    bwd = {} if args.fwd_only else protocol.time_alternating(_prepare(builders, True), timing)
    out_rows = []
    for key in builders:
        impl, mode, ev = key.split("/")
        f, b = fwd.get(key), bwd.get(key)
        out_rows.append({"impl": impl, "mode": mode, "evaluator": ev, "fwd_ms": f, "bwd_ms": b,
                         "fwd_tflops": None if f is None else causal_flops(lens, args.hq, args.headdim, False) / f / 1e9,
                         "bwd_tflops": None if b is None else causal_flops(lens, args.hq, args.headdim, True) / b / 1e9})
    return {**protocol.header(timing), "scenario": args.scenario, "lengths": lens,
            "shape": {"hq": args.hq, "hkv": args.hkv, "headdim": args.headdim, "tokens": sum(lens),
                      "sequences": len(lens), "max_len": max(lens)},
            "rows": out_rows, "ratios": ratios(out_rows, args.scenario)}


def ratios(rows: list[dict], scenario: str) -> dict:
    """baseline time / ours varlen time, per mode, evaluator and direction."""
    by = {(r["impl"], r["mode"], r["evaluator"]): r for r in rows}
    base = ("ours_dense",) if scenario == "equal" else ("fa4_varlen", "ours_padded")
    out = {}
    for (impl, mode, ev), r in by.items():
        pre = {"ours_varlen": "", "ours_varlen_nocheck": "nocheck:", "ours_varlen_knob": "knob:",
               "ours_varlen_bknob": "bknob:"}.get(impl)
        if pre is None:
            continue
        extra = {"": (), "nocheck:": ("ours_varlen",), "knob:": ("ours_varlen_nocheck",),
                 "bknob:": ("ours_varlen_nocheck",)}[pre]
        for b in base + extra:
            other = by.get((b, mode, ev if b.startswith("ours") else "native"))
            for d in ("fwd", "bwd"):
                if other and other.get(f"{d}_ms") and r.get(f"{d}_ms"):
                    out[f"{pre}{b}/{mode}/{ev}/{d}"] = other[f"{d}_ms"] / r[f"{d}_ms"]
    return out


def markdown(res: dict) -> str:
    lens = res["lengths"]
    lines = [f"# Varlen attention benchmark: {res['scenario']}", "",
             f"device {res['device']}, {res['date']}, commit {res['commit']}, torch {res['torch']}", "",
             f"Shape: {res['shape']}; lengths ({len(lens)}): {lens if len(lens) <= 40 else str(lens[:40]) + ' ...'}", "",
             f"Protocol: {res['protocol']}.", "",
             protocol.markdown_table(res["rows"], ["impl", "mode", "evaluator", "fwd_ms", "bwd_ms",
                                                   "fwd_tflops", "bwd_tflops"]), "",
             "| ratio (baseline time / ours varlen) | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in res["ratios"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=("equal", "ragged", "both"), default="both")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--evaluators", default="poly,native")
    p.add_argument("--batch", type=int, default=8, help="equal: number of sequences")
    p.add_argument("--seqlen", type=int, default=4096, help="equal: their length")
    p.add_argument("--tokens", type=int, default=32768, help="ragged: total tokens")
    p.add_argument("--seed", type=int, default=0, help="ragged: the length draw")
    for name, default in (("hq", 32), ("hkv", 8), ("headdim", 128)):
        p.add_argument(f"--{name}", type=int, default=default)
    protocol.add_timing_args(p, warmup=10, rounds=5, iters=20)
    p.add_argument("--order", choices=sorted(protocol.ORDERS), default="alternate")
    p.add_argument("--settle-ms", type=float, default=0.0)
    p.add_argument("--fwd-only", action="store_true")
    p.add_argument("--fwd-knob", default="", help="NAME=VALUE[+...]: an ours_varlen_knob row, the varlen forward "
                                                  "with these FwdConfig overrides (e.g. o_smem=1)")
    p.add_argument("--bwd-knob", default="", help="NAME=VALUE[+...]: an ours_varlen_bknob row, the varlen backward "
                                                  "with these BwdConfig overrides (e.g. dq_halves=1)")
    p.add_argument("--list", action="store_true", help="print the lengths and rows; time nothing (CPU)")
    protocol.add_json_arg(p, "varlen")
    args = p.parse_args(argv)
    args.fwd_overrides = parse_knob(args.fwd_knob)   # a bad name fails here, before any timing
    args.bwd_overrides = parse_knob(args.bwd_knob, "bwd")
    scenarios = ("equal", "ragged") if args.scenario == "both" else (args.scenario,)
    if args.list:
        for s in scenarios:
            args.scenario = s
            lens = lengths_for(args)
            print(f"{s}: {len(lens)} sequences, {sum(lens)} tokens, max {max(lens)}: {lens}")
            for r in rows_for(s, args.modes.split(","), args.evaluators.split(","), bool(args.fwd_knob),
                              bool(args.bwd_knob) and not args.fwd_only):
                print("  " + "/".join(r))
        return None
    results = {}
    for s in scenarios:
        args.scenario = s
        results[s] = run(args)
    path = protocol.output_path(args.json, "varlen")
    protocol.write_results(path, {"scenarios": results}, "\n".join(markdown(r) for r in results.values()))
    return results


if __name__ == "__main__":
    main()
