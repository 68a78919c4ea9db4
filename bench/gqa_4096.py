"""Causal GQA attention benchmark (the seed's B2/B3 shape): ours vs named baselines.

    python bench/gqa_4096.py --order shuffle --rounds 9 --graph-bwd   # H200: every row, side by side
    python bench/gqa_4096.py --pairs --pair-repeats 5                 # H200: the goal pairs, each alone
    python bench/gqa_4096.py --compile-only                           # CPU: SASS counts per kernel

Default shape: B=1, S=4096, H_q=32, H_kv=8, D=128, causal, BF16. Every row is timed side
by side in one run with the protocol in bench/protocol.py; forward and backward are
timed separately (backward: `torch.autograd.grad` on a retained graph, forward excluded).
Results go to bench/out/gqa_4096.json (`--pairs`: gqa_4096_pairs.json, `--compile-only`:
gqa_4096_sass.json) and the Markdown beside it; `--json bench/results/...` commits one.

Baselines (skipped, saying so, when not installed): flash-attn-4 4.0.0b36 softmax and
softcap, torch SDPA with the cuDNN backend, FlexAttention softcap (torch.compile), and
sigmoid attention written in torch and compiled with torch.compile.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402

SOFTCAP = 50.0


@dataclass
class Row:
    impl: str
    mode: str
    evaluator: str
    make: Callable  # (q, k, v) -> forward callable returning the output tensor
    program: str = ""  # ours/poly: the coefficient-table entry ("" = the mode's default)

    @property
    def key(self) -> str:
        return f"{self.impl}/{self.mode}/{self.evaluator}" + (f"/{self.program}" if self.program else "")


# the seed's packed-BF16 programs (attention(program=...)), timed beside the default FP16 ones
BF16_PROGRAMS = {"softcap": "softcap_c50", "sigmoid": "sigmoid_attn_n4096"}
# the two-region FP16 softcap (residual D5 below |x/c| = 1, 1 - tanh above; the default program for
# part of 2026-11-30, more accurate at saturating spreads, slower backward)
TWO_REGION_PROGRAM = "softcap_c50_f16_tail"
# the FP16 tanh program (odd_u2): the BF16 softcap poly default until 2026-12-01 (FP16 inputs'
# still). Since then the "" softcap poly rows run the exp2 offload exp2_f32_d3 (every tanh on
# MUFU, P = 2^a by an FP32 polynomial for 1/8 of the columns: flash_attn_poly/plan.py, PROGRAM_ROWS);
# the x50 round (59cca6e) timed it as a named row beside the then-default tanh program.
TANH_PROGRAM = "softcap_c50_f16_odd"


def ours(mode: str, evaluator: str, program: str = "") -> Row:
    import flash_attn_poly
    kw = {"softcap": SOFTCAP} if mode == "softcap" else {}
    if program:
        kw["program"] = program
    return Row("ours", mode, evaluator, lambda q, k, v: (
        lambda: flash_attn_poly.attention(q, k, v, mode, causal=True, evaluator=evaluator, **kw)), program)


def fa4(mode: str) -> Optional[Row]:
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # noqa: BLE001 - any import failure means the baseline is absent
        print(f"skip FA4 {mode}: flash-attn-4 not importable ({type(e).__name__}: {e})")
        return None
    cap = SOFTCAP if mode == "softcap" else 0.0
    return Row("fa4", mode, "native", lambda q, k, v: (
        lambda: flash_attn_func(q, k, v, causal=True, softcap=cap)))


def fa4_poly_softcap() -> Optional[Row]:
    """FA4 with our polynomial softcap plugged in through its score_mod hook (flash_attn_poly.fa4)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # noqa: BLE001
        print(f"skip FA4+poly softcap: flash-attn-4 not importable ({type(e).__name__})")
        return None
    from flash_attn_poly.fa4 import softcap_score_mods
    fwd, bwd = softcap_score_mods(SOFTCAP)
    return Row("fa4_score_mod", "softcap", "poly", lambda q, k, v: (
        lambda: flash_attn_func(q, k, v, causal=True, score_mod=fwd, score_mod_bwd=bwd)))


def sdpa_cudnn() -> Row:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def make(q, k, v):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

        def f():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=True, enable_gqa=True)
        return f
    return Row("sdpa_cudnn", "softmax", "native", make)


def flex_softcap() -> Row:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)

    def make(q, k, v):
        s = q.shape[1]
        mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, s, s, device=q.device)
        cap = lambda score, b, h, i, j: SOFTCAP * torch.tanh(score / SOFTCAP)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        return lambda: flex(qt, kt, vt, score_mod=cap, block_mask=mask, enable_gqa=True)
    return Row("flex_compiled", "softcap", "native", make)


def compiled_sigmoid() -> Row:
    import torch

    def sigmoid_attn(q, k, v):
        b, s, hq, d = q.shape
        g = hq // k.shape[2]
        qt = q.transpose(1, 2).float()
        kt = k.transpose(1, 2).repeat_interleave(g, 1).float()
        vt = v.transpose(1, 2).repeat_interleave(g, 1)
        x = qt @ kt.transpose(-1, -2) * d ** -0.5 - math.log(s)
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        p = torch.sigmoid(x).masked_fill(~mask, 0).to(v.dtype)
        return (p @ vt).transpose(1, 2)
    fn = torch.compile(sigmoid_attn)
    return Row("torch_compile", "sigmoid", "native", lambda q, k, v: (lambda: fn(q, k, v)))


def all_rows(bf16: bool = True) -> list[Row]:
    rows = [ours("softmax", "native"), ours("softcap", "native"), ours("softcap", "poly"),
            ours("sigmoid", "native"), ours("sigmoid", "poly")]
    if bf16:
        rows += [ours(m, "poly", p) for m, p in BF16_PROGRAMS.items()]
        rows.append(ours("softcap", "poly", TWO_REGION_PROGRAM))
        rows.append(ours("softcap", "poly", TANH_PROGRAM))
    rows += [r for r in (fa4("softmax"), fa4("softcap"), fa4_poly_softcap()) if r is not None]
    rows += [sdpa_cudnn(), flex_softcap(), compiled_sigmoid()]
    return rows


def select_rows(rows: list[Row], impls: str | None) -> list[Row]:
    """Keep the rows whose impl is in the comma-separated list (None: all)."""
    if not impls:
        return rows
    want = {x.strip() for x in impls.split(",") if x.strip()}
    known = {r.impl for r in rows}
    if want - known:
        raise SystemExit(f"--impls: unknown {sorted(want - known)}; known here: {sorted(known)}")
    return [r for r in rows if r.impl in want]


def _inputs(args, requires_grad: bool):
    import torch
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(args.batch, args.seqlen, h, args.headdim, device="cuda",
                               dtype=torch.bfloat16, generator=g).requires_grad_(requires_grad)
    return mk(args.hq), mk(args.hkv), mk(args.hkv)


def _prepare(rows, args, backward: bool):
    """Build each row's timed callable; a row that fails to run is reported and dropped."""
    import torch
    fns = {}
    for row in rows:
        key = row.key
        try:
            q, k, v = _inputs(args, backward)
            if not backward:
                with torch.no_grad():
                    fwd = row.make(q, k, v)
                    fwd()
                fns[key] = lambda fwd=fwd: _no_grad(fwd)
            else:
                out = _first(row.make(q, k, v)())
                dout = torch.randn_like(out)
                fns[key] = lambda out=out, q=q, k=k, v=v, dout=dout: torch.autograd.grad(
                    out, (q, k, v), dout, retain_graph=True)
                fns[key]()
        except Exception as e:  # noqa: BLE001 - report and keep benchmarking the rest
            print(f"skip {key} {'bwd' if backward else 'fwd'}: {type(e).__name__}: {str(e)[:200]}")
    return fns


def _prepare_step(rows, args):
    """Forward + backward callables (a fresh autograd graph per call) for --graph-bwd: autograd
    runs each backward op on its forward op's stream, so a backward alone on a retained graph
    from an uncaptured forward cannot be captured; the step can, and bwd_graph_ms is the step
    graph minus the forward graph."""
    import torch
    fns = {}
    for row in rows:
        try:
            q, k, v = _inputs(args, True)
            fwd = row.make(q, k, v)
            dout = torch.randn_like(_first(fwd()))
            fns[row.key] = lambda fwd=fwd, q=q, k=k, v=v, dout=dout: torch.autograd.grad(
                _first(fwd()), (q, k, v), dout)
            fns[row.key]()
        except Exception as e:  # noqa: BLE001
            print(f"skip {row.key} step: {type(e).__name__}: {str(e)[:200]}")
    return fns


def _first(x):
    """Some libraries return (out, lse): keep the output."""
    return x[0] if isinstance(x, tuple) else x


def _no_grad(fn):
    import torch
    with torch.no_grad():
        return fn()


def flops(args, backward: bool) -> float:
    f = 4 * args.batch * args.hq * args.seqlen ** 2 * args.headdim / 2  # causal half
    return f * (2.5 if backward else 1.0)


def run(args) -> dict:
    rows = select_rows(all_rows(not args.no_bf16), args.impls)
    timing = protocol.Timing(args.warmup, args.rounds, args.iters, args.order, args.settle_ms)
    fwd_fns = _prepare(rows, args, False)
    fwd, fwd_clk = protocol.time_with_clocks(fwd_fns, timing, args.clocks)
    want_graph = args.graph or args.graph_bwd
    graph = {k: protocol.graph_time(f, timing) for k, f in fwd_fns.items()} if want_graph else {}
    bwd, bwd_clk, bwd_graph = {}, {}, {}
    if not args.fwd_only:
        bwd_fns = _prepare(rows, args, True)
        bwd, bwd_clk = protocol.time_with_clocks(bwd_fns, timing, args.clocks)
        del bwd_fns
        if args.graph_bwd:
            step = {k: protocol.graph_time(f, timing) for k, f in _prepare_step(rows, args).items()}
            bwd_graph = {k: t - graph[k] for k, t in step.items()
                         if t is not None and graph.get(k) is not None}
    out_rows = []
    for row in rows:
        f, b = fwd.get(row.key), bwd.get(row.key)
        graph_ms = graph.get(row.key)
        r = {"impl": row.impl, "mode": row.mode, "evaluator": row.evaluator, "program": row.program,
             "fwd_ms": f, "bwd_ms": b, "fwd_graph_ms": graph_ms,
             "fwd_tflops": None if f is None else flops(args, False) / f / 1e9,
             "bwd_tflops": None if b is None else flops(args, True) / b / 1e9}
        if args.graph_bwd:
            r["bwd_graph_ms"] = bwd_graph.get(row.key)
        for d, clk in (("fwd", fwd_clk), ("bwd", bwd_clk)):
            if row.key in clk:
                r[f"{d}_sm_mhz"], r[f"{d}_power_w"] = clk[row.key]["sm_mhz"], clk[row.key]["power_w"]
                r[f"{d}_clock_reasons"] = clk[row.key]["reasons"]
        out_rows.append(r)
    return {**protocol.header(timing), "shape": _shape(args), "rows": out_rows, "ratios": ratios(out_rows)}


def _shape(args) -> dict:
    return dict(batch=args.batch, seqlen=args.seqlen, hq=args.hq, hkv=args.hkv,
                headdim=args.headdim, causal=True, dtype="bfloat16", softcap=SOFTCAP)


def ratio_pairs() -> dict:
    """name -> (baseline row id, our row id), row id = (impl, mode, evaluator, program): the pairs
    the issues set goals on, plus the program comparisons."""
    sc_bf16, sg_bf16 = ("ours", "softcap", "poly", BF16_PROGRAMS["softcap"]), ("ours", "sigmoid", "poly", BF16_PROGRAMS["sigmoid"])
    return {"softcap poly vs ours native": (("ours", "softcap", "native", ""), ("ours", "softcap", "poly", "")),
             "softcap poly vs FA4 softcap": (("fa4", "softcap", "native", ""), ("ours", "softcap", "poly", "")),
             "softcap poly vs ours softmax": (("ours", "softmax", "native", ""), ("ours", "softcap", "poly", "")),
             "sigmoid poly vs ours native": (("ours", "sigmoid", "native", ""), ("ours", "sigmoid", "poly", "")),
             "sigmoid poly vs FA4 softmax": (("fa4", "softmax", "native", ""), ("ours", "sigmoid", "poly", "")),
             "ours softmax vs FA4 softmax": (("fa4", "softmax", "native", ""), ("ours", "softmax", "native", "")),
             "FA4+poly score_mod vs FA4 softcap": (("fa4", "softcap", "native", ""), ("fa4_score_mod", "softcap", "poly", "")),
             "softcap poly bf16 program vs FA4 softcap": (("fa4", "softcap", "native", ""), sc_bf16),
             "softcap poly bf16 program vs default (f16)": (("ours", "softcap", "poly", ""), sc_bf16),
             "sigmoid poly bf16 program vs FA4 softmax": (("fa4", "softmax", "native", ""), sg_bf16),
             "sigmoid poly bf16 program vs default (f16)": (("ours", "sigmoid", "poly", ""), sg_bf16),
             "softcap poly two-region program vs FA4 softcap": (("fa4", "softcap", "native", ""),
                                                              ("ours", "softcap", "poly", TWO_REGION_PROGRAM)),
             "softcap poly two-region program vs default": (("ours", "softcap", "poly", ""),
                                                          ("ours", "softcap", "poly", TWO_REGION_PROGRAM)),
             "softcap poly (exp2 default) vs tanh program": (("ours", "softcap", "poly", TANH_PROGRAM),
                                                             ("ours", "softcap", "poly", "")),
             "softcap poly tanh program vs ours native": (("ours", "softcap", "native", ""),
                                                          ("ours", "softcap", "poly", TANH_PROGRAM)),
             "softcap poly tanh program vs FA4 softcap": (("fa4", "softcap", "native", ""),
                                                          ("ours", "softcap", "poly", TANH_PROGRAM))}


def ratios(rows: list[dict]) -> dict:
    """Speedups (baseline time / our time) for ratio_pairs(), from one run's rows."""
    t = {(r["impl"], r["mode"], r["evaluator"], r.get("program", "")): r for r in rows}
    out = {}
    for name, (base, mine) in ratio_pairs().items():
        for d in ("fwd", "bwd"):
            a, b = t.get(base, {}).get(f"{d}_ms"), t.get(mine, {}).get(f"{d}_ms")
            if a and b:
                out[f"{name} ({d})"] = a / b
    return out


def row_key(row_id: tuple) -> str:
    """Row.key of a ratio_pairs() row id."""
    impl, mode, ev, program = row_id
    return f"{impl}/{mode}/{ev}" + (f"/{program}" if program else "")


PAIR_NOTE = ("Pairwise protocol (--pairs): each pair below is timed alone, its two rows only, under "
             "the protocol above (the seed's native/poly protocol: alternating which runs first); "
             "that is repeated --pair-repeats times, pairs interleaved, and the median, min and max "
             "of the repeats' ratios are reported. No other row shares the GPU's power budget "
             "history (bench/protocol.py on order).")


def run_pairs(args, names: list[str], timing) -> list[dict]:
    """Each named ratio_pairs() pair timed alone (two rows), forward and backward."""
    pairs = {n: ratio_pairs()[n] for n in names}
    rows = {r.key: r for r in all_rows(True)}
    need = list({row_key(x): rows[row_key(x)] for pr in pairs.values() for x in pr if row_key(x) in rows}.values())
    out = []
    for d, backward in (("fwd", False), ("bwd", True)):
        if backward and args.fwd_only:
            continue
        fns = _prepare(need, args, backward)
        res = {n: [] for n in pairs}
        clk = {n: [] for n in pairs}
        for _ in range(args.pair_repeats):
            for n, (base, mine) in pairs.items():
                b, m = row_key(base), row_key(mine)
                if b in fns and m in fns:
                    t, c = protocol.time_with_clocks({b: fns[b], m: fns[m]}, timing, args.clocks)
                    res[n].append((t[b], t[m]))
                    if c.get(b) and c.get(m):
                        clk[n].append((c[b]["sm_mhz"], c[m]["sm_mhz"]))
        del fns
        for n, ts in res.items():
            if ts:
                r = sorted(a / b for a, b in ts)
                row = {"pair": n, "dir": d, "ratio_median": statistics.median(r),
                       "ratio_min": r[0], "ratio_max": r[-1],
                       "base_ms": [a for a, _ in ts], "ours_ms": [b for _, b in ts]}
                if clk[n]:
                    row["base_sm_mhz"], row["ours_sm_mhz"] = [a for a, _ in clk[n]], [b for _, b in clk[n]]
                out.append(row)
    return out


def pairs_markdown(pairs: list[dict]) -> str:
    mhz = any("base_sm_mhz" in p for p in pairs)
    lines = ["", PAIR_NOTE, "", "| pair (baseline time / ours) | dir | median | min | max | baseline ms | ours ms |"
             + (" baseline MHz | ours MHz |" if mhz else ""), "|---|---|---|---|---|---|---|" + ("---|---|" if mhz else "")]
    for p in pairs:
        line = (f"| {p['pair']} | {p['dir']} | {p['ratio_median']:.3f} | {p['ratio_min']:.3f} | "
                f"{p['ratio_max']:.3f} | {statistics.median(p['base_ms']):.3f} | "
                f"{statistics.median(p['ours_ms']):.3f} |")
        if mhz:
            f = lambda k: f"{statistics.median(p[k]):.0f}" if p.get(k) else "—"
            line += f" {f('base_sm_mhz')} | {f('ours_sm_mhz')} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


GOAL_PAIRS = ("ours softmax vs FA4 softmax", "softcap poly vs FA4 softcap", "sigmoid poly vs FA4 softmax",
              "softcap poly vs ours softmax", "sigmoid poly bf16 program vs FA4 softmax",
              "softcap poly vs ours native", "sigmoid poly vs ours native")


SASS_FAMILIES = ("HGMMA", "MUFU.EX2", "MUFU.TANH", "MUFU.RCP", "HFMA2.BF16", "HMUL2", "FFMA", "STL", "LDL")
MODES = (("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
         ("sigmoid", "native"), ("sigmoid", "poly"))


def compile_only(head_dim: int = 128) -> dict:
    """Build every forward and backward kernel attention() picks at the anchor shape for sm_90a
    (no GPU) and count SASS opcodes. The builds are tests/sass_catalogue.py's (the SASS safety
    net's adapters), so this reads exactly what a BF16 call with softcap 50 runs."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    sys.path.insert(0, os.path.join(os.path.dirname(protocol.BENCH_DIR), "tests"))
    import time

    import sass_catalogue as cat
    from flash_attn_poly.kernels import sass
    catalogue = cat.builds()
    jobs = [(mode, ev, d) for mode, ev in MODES for d in ("fwd", "bwd")]
    report = {}
    for i, (mode, ev, d) in enumerate(jobs):
        name = f"{mode}_{ev}_d{head_dim}_bf16"
        if name not in catalogue:
            raise SystemExit(f"--headdim {head_dim}: no default build {name!r} in tests/sass_catalogue.py")
        t0 = time.time()
        call = catalogue[name]
        text = cat.sass_text(cat.fwd_kernel(call) if d == "fwd" else cat.bwd_kernel(call))
        counts = sass.count_opcodes(text)
        report[f"{mode}/{ev}/{d}"] = {f: counts.get(f, 0) for f in SASS_FAMILIES}
        protocol.progress(f"[{i + 1}/{len(jobs)}] {mode}/{ev} {d}, D={head_dim}: compiled and "
                          f"disassembled in {time.time() - t0:.1f} s")
    return report


def sass_markdown(res: dict) -> str:
    rows = [{"kernel": k, **v} for k, v in res["kernels"].items()]
    return (f"# Attention SASS counts ({res['arch']}, {res['date']}, commit {res['commit']})\n\n"
            f"{res['what']}.\n\n" + protocol.markdown_table(rows, ["kernel", *SASS_FAMILIES]) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    protocol.add_shape_args(p)
    protocol.add_timing_args(p, warmup=25, rounds=5, iters=100)
    p.add_argument("--fwd-only", action="store_true")
    p.add_argument("--order", choices=sorted(protocol.ORDERS), default="alternate",
                   help="implementation order per round: the seed's listed/reversed, or a seeded "
                        "shuffle (bench/protocol.py says why)")
    p.add_argument("--pairs", action="store_true",
                   help="time only the goal pairs, each pair alone (GOAL_PAIRS; PAIR_NOTE says how)")
    p.add_argument("--pair-repeats", type=int, default=3)
    p.add_argument("--pair-names", help="with --pairs: these ratio_pairs() names, comma-separated, instead of GOAL_PAIRS")
    p.add_argument("--settle-ms", type=float, default=0.0,
                   help="idle the GPU this long before every timed segment (protocol.Timing.settle_ms)")
    p.add_argument("--impls", help="comma-separated impls to keep, e.g. ours,fa4 (default: every row)")
    p.add_argument("--no-bf16", action="store_true", help="leave out the rows of ours with a named program (the BF16 programs, the tail program)")
    p.add_argument("--graph", action="store_true",
                   help="also time each forward as a replayed CUDA graph (GPU time without host launch cost)")
    p.add_argument("--graph-bwd", action="store_true",
                   help="also time forward+backward steps as replayed CUDA graphs (implies --graph); "
                        "bwd_graph_ms = step graph - forward graph")
    p.add_argument("--clocks", action="store_true",
                   help="sample nvidia-smi while timing: mean SM clock, power and clock-event reasons per row "
                        "(bench/tools/clocks.py)")
    p.add_argument("--compile-only", action="store_true",
                   help="CPU: compile every default kernel at --headdim, write SASS counts (a progress line per build)")
    protocol.add_json_arg(p, "gqa_4096")
    args = p.parse_args(argv)
    if args.compile_only:
        import datetime
        path = protocol.output_path(args.json, "gqa_4096_sass")
        res = {"arch": "sm_90a (CUTE_DSL_ARCH, compiled on the CPU)", "commit": protocol.commit_id(),
               "date": datetime.date.today().isoformat(),
               "what": f"SASS opcode counts per kernel (whole kernel, all loops), B=1 S=4096 Hq=32 Hkv=8 "
                       f"D={args.headdim} causal BF16 defaults as attention() builds them (softcap 50; "
                       f"tests/sass_catalogue.py)",
               "kernels": compile_only(args.headdim)}
        protocol.write_results(path, res, sass_markdown(res))
        print(json.dumps(res, indent=2))
        return
    if args.pairs:
        path = protocol.output_path(args.json, "gqa_4096_pairs")
        timing = protocol.Timing(args.warmup, args.rounds, args.iters, settle_ms=args.settle_ms)
        shape = _shape(args)
        res = {**protocol.header(timing), "shape": shape, "pair_protocol": PAIR_NOTE,
               "pairs": run_pairs(args, args.pair_names.split(",") if args.pair_names else list(GOAL_PAIRS), timing)}
        md = (f"# Attention benchmark, goal pairs: {shape}\n\ndevice {res['device']}, {res['date']}, "
              f"commit {res['commit']}, torch {res['torch']}\n\nProtocol: {res['protocol']}.\n"
              + pairs_markdown(res["pairs"]))
        protocol.write_results(path, res, md)
        print(md)
        return
    path = protocol.output_path(args.json, "gqa_4096")
    res = run(args)
    protocol.write_results(path, res, markdown(res))
    print(markdown(res))


EXTRA_COLUMNS = ("bwd_graph_ms", "fwd_sm_mhz", "fwd_power_w", "bwd_sm_mhz", "bwd_power_w", "bwd_clock_reasons")


def markdown(res: dict) -> str:
    lines = [f"# Attention benchmark: {res['shape']}", "",
             f"device {res['device']}, {res['date']}, commit {res['commit']}, torch {res['torch']}", "",
             f"Protocol: {res['protocol']}.", "",
             protocol.markdown_table(res["rows"], ["impl", "mode", "evaluator", "program", "fwd_ms", "bwd_ms",
                                                   "fwd_graph_ms", "fwd_tflops", "bwd_tflops"]
                                     + [c for c in EXTRA_COLUMNS if any(c in r for r in res["rows"])]), "",
             "fwd_ms/bwd_ms: back-to-back calls through each library's Python entry point (host "
             "launch cost included where it exceeds GPU time); fwd_graph_ms: the same call captured "
             "in a CUDA graph and replayed (GPU time only); bwd_graph_ms (--graph-bwd): a forward+backward "
             "step captured the same way, minus fwd_graph_ms; *_sm_mhz / *_power_w / bwd_clock_reasons (--clocks): nvidia-smi samples "
             "inside the row's timed segments (bench/tools/clocks.py).", "",
             "| ratio (baseline time / ours) | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in res["ratios"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
