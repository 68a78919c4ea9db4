"""The standard attention grid: ours against FA4, cuDNN (torch SDPA) and FlexAttention, per cell.

    python bench/sweep.py --quick                        # H200 (~4 min): S 1k and 4k, D 128, causal, GQA
    python bench/sweep.py --cells 'softmax-d64-*' --budget-s 520 --json bench/out/sweep_d64.json
    python bench/sweep.py --dry-run [--quick] [--cells ...]   # CPU: cell list, compile estimate
    python bench/sweep.py --merge a.json b.json --json bench/results/sweep.json   # CPU: one report

The grid (issue 27): B x S = 16384 tokens for S in {512, 1k, 2k, 4k, 8k, 16k}, plus S = 32k at
B = 1; D in {64, 128, 256}; causal and non-causal ("full"); GQA 32/8 (16/8 at D = 256) and MHA
(32/32, 16/16 at D = 256); modes softmax, softcap 50 and sigmoid, each with attention()'s default
program (evaluator "poly"); BF16; forward and backward.  A cell is one shape x one mode, named
like `softcap-d128-causal-h32-8-s4096-b4` (`--cells` takes comma-separated globs of these names).
Rows per cell: softmax: ours, FA4, cuDNN; softcap: ours, FA4 (softcap=50), FlexAttention
(compiled, tanh score_mod); sigmoid: ours.  Softcap and sigmoid cells also time our softmax at
the same shape (a row with "reference": true), because their goals compare against it and the
issue asks for ratios measured side by side in one run.

Each cell runs in its own process (the driver spawns `sweep.py --run-cell NAME`), so a crash,
hang or OOM in one cell loses only that cell; inside a cell every implementation is timed side by
side with bench/protocol.py's interleaved rounds (shuffled order; forward, then backward as
`torch.autograd.grad` on a retained graph); nvidia-smi is sampled beside the rounds and each row
records the mean SM clock, board power and clock-event reasons of its own segments (sm_mhz,
power_w, clock_reasons: under the power cap a row's clock depends on its neighbours' draw).  The
driver rewrites the JSON and Markdown after
every cell, stops starting cells when `--budget-s` would be exceeded, and draws the PNGs at the
end (into figures/ beside the JSON).  FLOPs: 4 B Hq S^2 D forward, halved when causal, backward 2.5x the forward (the standard
attention convention; sigmoid counted the same).  Peak: 989 TFLOP/s (H200 dense BF16).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import fnmatch
import gc
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402

SOFTCAP = 50.0
PEAK_TFLOPS = 989.0                 # H200 dense BF16 (the reference)
TOKENS = 16384                      # B x S of the grid's rows
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)   # 32k: B = 1 (over TOKENS)
HEADDIMS = (64, 128, 256)
MODES = ("softmax", "softcap", "sigmoid")
DIRECTIONS = ("fwd", "bwd")
IMPLS = {"softmax": ("ours", "fa4", "cudnn"), "softcap": ("ours", "fa4", "flex"), "sigmoid": ("ours",)}
ALL_IMPLS = ("ours", "fa4", "cudnn", "flex")
QUICK = dict(seqlens=(1024, 4096), headdims=(128,), causal=(True,), gqa=(True,))

FLOP_TEXT = ("FLOPs = 4 B Hq S^2 D forward (QK^T and PV), halved when causal; backward 2.5x the "
             "forward (the standard attention convention, as FlashAttention's benchmarks count); "
             "sigmoid is counted the same. TFLOP/s = FLOPs / median time")

# Per-cell iteration policy: a timed segment of about SEGMENT_MS, from a time estimate at
# NOMINAL_TFLOPS (a planning rate, not a measurement; it only sizes the loops).  The grid's calls
# span ~600x in FLOPs (S = 512 causal forward to S = 32k full backward: ~0.2 to ~110 ms at that
# rate), so a fixed count either times launch jitter at the small end (a few calls) or spends
# minutes per cell at the large end (100 calls); 3 calls of ~100 ms are already a stable mean.
NOMINAL_TFLOPS = 400.0
SEGMENT_MS, WARMUP_MS = 25.0, 100.0
MIN_ITERS, MAX_ITERS = 3, 100
MIN_WARMUP, MAX_WARMUP = 3, 25

_CELL_RE = re.compile(r"(softmax|softcap|sigmoid)-d(\d+)-(causal|full)-h(\d+)-(\d+)-s(\d+)-b(\d+)")


# ------------------------------------------------------------------------------------ the grid
@dataclass(frozen=True)
class Cell:
    mode: str
    headdim: int
    causal: bool
    hq: int
    hkv: int
    seqlen: int
    batch: int

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        return f"{self.mode}-d{self.headdim}-{mask}-h{self.hq}-{self.hkv}-s{self.seqlen}-b{self.batch}"

    @property
    def shape(self) -> dict:
        return dict(batch=self.batch, seqlen=self.seqlen, hq=self.hq, hkv=self.hkv,
                    headdim=self.headdim, causal=self.causal)

    @classmethod
    def parse(cls, name: str) -> "Cell":
        m = _CELL_RE.fullmatch(name)
        if not m:
            raise ValueError(f"cell name {name!r} is not MODE-dD-(causal|full)-hHQ-HKV-sS-bB, e.g. "
                             "softmax-d128-causal-h32-8-s4096-b4")
        mode, d, mask, hq, hkv, s, b = m.groups()
        return cls(mode, int(d), mask == "causal", int(hq), int(hkv), int(s), int(b))


def heads(headdim: int, gqa: bool) -> tuple[int, int]:
    """(Hq, Hkv): GQA 32/8 (16/8 at D = 256, the same FLOPs per token as 32 heads of 128), MHA
    with Hkv = Hq."""
    hq = 16 if headdim == 256 else 32
    return (hq, 8) if gqa else (hq, hq)


def batch_for(seqlen: int) -> int:
    return max(1, TOKENS // seqlen)


def grid(seqlens=SEQLENS, headdims=HEADDIMS, causal=(True, False), gqa=(True, False),
         modes=MODES) -> list[Cell]:
    """The issue's grid (defaults: 7 x 3 x 2 x 2 shapes x 3 modes = 252 cells), ordered so that
    the cells of one shape are adjacent (their processes reuse the compile caches' entries)."""
    return [Cell(m, d, c, *heads(d, g), s, batch_for(s))
            for d in headdims for c in causal for g in gqa for s in seqlens for m in modes]


def select(cells: list[Cell], patterns: Optional[str]) -> list[Cell]:
    """The cells whose names match one of the comma-separated globs (None: all of them)."""
    if not patterns:
        return cells
    globs = [p.strip() for p in patterns.split(",") if p.strip()]
    out = [c for c in cells if any(fnmatch.fnmatchcase(c.name, g) for g in globs)]
    if not out:
        raise SystemExit(f"--cells {patterns!r} matches no cell; names look like {cells[0].name}")
    return out


def flops(shape: dict, direction: str) -> float:
    f = 4.0 * shape["batch"] * shape["hq"] * shape["seqlen"] ** 2 * shape["headdim"]
    if shape["causal"]:
        f /= 2
    return f * (2.5 if direction == "bwd" else 1.0)


def tflops(shape: dict, direction: str, ms: float) -> float:
    return flops(shape, direction) / ms / 1e9


def loop_sizes(shape: dict, direction: str) -> tuple[int, int]:
    """(warm-up calls, calls per timed segment) of a cell's direction (the policy above)."""
    est_ms = flops(shape, direction) / (NOMINAL_TFLOPS * 1e9)
    iters = min(MAX_ITERS, max(MIN_ITERS, math.ceil(SEGMENT_MS / est_ms)))
    warmup = min(MAX_WARMUP, max(MIN_WARMUP, math.ceil(WARMUP_MS / est_ms)))
    return warmup, iters


def cell_rows(cell: Cell, impls=ALL_IMPLS) -> list[tuple[str, str]]:
    """(impl, mode) of every row a cell times: the mode's implementations (those in impls), then
    our softmax as the reference of a softcap or sigmoid cell."""
    rows = [(i, cell.mode) for i in IMPLS[cell.mode] if i in impls]
    if cell.mode != "softmax" and "ours" in impls:
        rows.append(("ours", "softmax"))
    return rows


# ----------------------------------------------------------------------------------- the goals
@dataclass(frozen=True)
class Goal:
    name: str                  # the short name in the Markdown's goal column
    mode: str                  # checked in this mode's cells
    directions: tuple
    metric: str                # a key of cell_results()' ratios ("peak": ours / PEAK_TFLOPS)
    threshold: float
    text: str
    headdims: tuple = HEADDIMS
    min_seqlen: int = 0

    def applies(self, res: dict) -> bool:
        return (res["mode"] == self.mode and res["direction"] in self.directions
                and res["headdim"] in self.headdims and res["seqlen"] >= self.min_seqlen)


GOALS = (
    Goal("softmax>=best", "softmax", DIRECTIONS, "vs_best", 1.0,
         "softmax, forward and backward: >= 1.0x the faster of FA4 and cuDNN in every cell"),
    Goal("softcap>=1.8xFA4", "softcap", DIRECTIONS, "vs_fa4", 1.8,
         "softcap (default program): >= 1.8x FA4's softcap in every cell (forward and backward)"),
    Goal("softcap>=0.9xsoftmax", "softcap", ("fwd",), "vs_own_softmax", 0.9,
         "softcap (default program) forward: >= 0.9x our own softmax forward at D >= 128",
         headdims=(128, 256)),
    Goal("sigmoid>=softmax", "sigmoid", DIRECTIONS, "vs_own_softmax", 1.0,
         "sigmoid (default program): no slower than our softmax in any cell (forward and backward)"),
    Goal("fwd>=70%peak", "softmax", ("fwd",), "peak", 0.70,
         "our softmax forward >= 70% of peak (692 TFLOP/s) at S >= 8k, D = 128",
         headdims=(128,), min_seqlen=8192),
    Goal("bwd>=60%peak", "softmax", ("bwd",), "peak", 0.60,
         "our softmax backward >= 60% of peak (593 TFLOP/s) at S >= 8k, D = 128",
         headdims=(128,), min_seqlen=8192),
)
GEOMEAN_GOAL = 1.05   # softmax: geometric mean of vs_best over the grid's cells (both directions)


def _key(row: dict) -> str:
    """A row's column in its cell: the impl, or ours_softmax for a softcap/sigmoid cell's reference."""
    return "ours_softmax" if row.get("reference") else row["impl"]


def cell_results(rows: list[dict]) -> list[dict]:
    """One entry per (cell, direction): shape, ms and TFLOP/s per column, the ratios (baseline time
    / our time: > 1 means ours is faster), and each applicable goal's verdict (True / False, None
    where a row it needs is missing)."""
    by = {}
    for r in rows:
        by.setdefault((r["cell"], r["direction"]), []).append(r)
    out = []
    for (name, direction), rs in by.items():
        cell = Cell.parse(name)
        ms = {_key(r): r["ms"] for r in rs if r.get("ms")}
        tf = {k: tflops(cell.shape, direction, t) for k, t in ms.items()}
        ours = ms.get("ours")
        ratios = {}
        if ours:
            base = [ms[k] for k in ("fa4", "cudnn") if k in ms]
            if cell.mode == "softmax" and base:
                ratios["vs_best"] = min(base) / ours
            for k in ("fa4", "cudnn", "flex"):
                if k in ms:
                    ratios[f"vs_{k}"] = ms[k] / ours
            if "ours_softmax" in ms:
                ratios["vs_own_softmax"] = ms["ours_softmax"] / ours
            ratios["peak"] = tf["ours"] / PEAK_TFLOPS
        res = {"cell": name, "mode": cell.mode, "direction": direction, **cell.shape,
               "ms": ms, "tflops": tf, "ratios": ratios}
        if "vs_best" in ratios and len(base) == 1:   # the other baseline has no row here (its skip reason is listed)
            res["best_of_one"] = "fa4" if "fa4" in ms else "cudnn"
        res["goals"] = {g.name: (None if g.metric not in ratios else ratios[g.metric] >= g.threshold)
                        for g in GOALS if g.applies(res)}
        out.append(res)
    # the grid's order: D, causal first, GQA first, S, mode, forward first
    return sorted(out, key=lambda r: (r["headdim"], not r["causal"], r["hq"] == r["hkv"], r["hq"], r["seqlen"],
                                      MODES.index(r["mode"]), DIRECTIONS.index(r["direction"])))


def geomean(values: list[float]) -> Optional[float]:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def goal_summary(results: list[dict]) -> list[dict]:
    """Per goal: cells checked, passed, failed, missing, and the worst cell."""
    out = []
    for g in GOALS:
        hits = [r for r in results if g.name in r["goals"]]
        vals = [(r["ratios"][g.metric], r) for r in hits if r["goals"][g.name] is not None]
        worst = min(vals, key=lambda x: x[0]) if vals else None
        out.append({"goal": g.name, "text": g.text, "threshold": g.threshold, "checked": len(hits),
                    "pass": sum(r["goals"][g.name] is True for r in hits),
                    "fail": sum(r["goals"][g.name] is False for r in hits),
                    "missing": sum(r["goals"][g.name] is None for r in hits),
                    "worst": None if worst is None else worst[0],
                    "worst_cell": None if worst is None else f"{worst[1]['cell']} {worst[1]['direction']}"})
    vb = [r["ratios"]["vs_best"] for r in results if r["mode"] == "softmax" and "vs_best" in r["ratios"]]
    gm = geomean(vb)
    out.append({"goal": "softmax geomean>=1.05", "threshold": GEOMEAN_GOAL,
                "text": "softmax: >= 1.05x geometric mean (over the measured cells, forward and backward) "
                        "of the ratio to the faster of FA4 and cuDNN",
                "checked": len(vb), "pass": int(gm is not None and gm >= GEOMEAN_GOAL),
                "fail": int(gm is not None and gm < GEOMEAN_GOAL), "missing": 0,
                "worst": gm, "worst_cell": "(the geometric mean)"})
    return out


def softmax_classes(results: list[dict]) -> tuple[list[dict], dict]:
    """Softmax ours / best by class (direction, D, mask, MHA or GQA, S <= 2k or longer) and what the
    geomean goal needs: the grid's geomean if every cell below 1.0 were at parity (the ceiling of
    closing every gap without a lead anywhere new), and the uniform factor on every cell's ratio
    that would reach GEOMEAN_GOAL."""
    cls: dict = {}
    for r in results:
        if r["mode"] == "softmax" and "vs_best" in r["ratios"]:
            key = (r["direction"], r["headdim"], "causal" if r["causal"] else "full",
                   "MHA" if r["hq"] == r["hkv"] else "GQA", "S <= 2k" if r["seqlen"] <= 2048 else "S >= 4k")
            cls.setdefault(key, []).append(r["ratios"]["vs_best"])
    rows = [{"direction": k[0], "D": k[1], "mask": k[2], "heads": k[3], "S": k[4], "cells": len(v),
             "geomean": geomean(v), "min": min(v), "max": max(v)} for k, v in sorted(cls.items())]
    vals = [x for v in cls.values() for x in v]
    gm = geomean(vals)
    need = {"cells": len(vals), "geomean": gm, "parity_ceiling": geomean([max(1.0, x) for x in vals]),
            "uniform_factor": GEOMEAN_GOAL / gm if gm else None}
    return rows, need


# --------------------------------------------------------------------------- one cell (a process)
_FLEX = {}


@dataclass
class Made:
    fn: Callable[[], object]     # one call of the implementation
    grad_inputs: tuple           # what the backward differentiates against
    note: str = ""


def _make(impl: str, mode: str, cell: Cell, q, k, v) -> Made:
    """impl's attention of mode on q, k, v (B, S, H, D) as a callable, through its public API."""
    import torch
    causal = cell.causal
    if impl == "ours":
        import flash_attn_poly
        kw = {"softcap": SOFTCAP} if mode == "softcap" else {}
        # "cuda": an error, never a silent fallback to the torch reference; on the CPU (the
        # --device cpu harness check) the reference backend
        backend = "cuda" if q.is_cuda else "reference"
        return Made(lambda: flash_attn_poly.attention(q, k, v, mode, causal=causal, backend=backend, **kw),
                    (q, k, v))
    if impl == "fa4":
        from flash_attn.cute import flash_attn_func
        cap = SOFTCAP if mode == "softcap" else 0.0
        return Made(lambda: flash_attn_func(q, k, v, causal=causal, softcap=cap), (q, k, v))
    if impl == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def cudnn(qq, kk, vv, gqa):
            qt, kt, vt = (t.transpose(1, 2) for t in (qq, kk, vv))

            def f():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return sdpa(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
            return f
        if cell.hq == cell.hkv:
            return Made(cudnn(q, k, v, False), (q, k, v))
        try:    # GQA inside cuDNN where this torch passes it through (forward and, if asked, backward)
            fn = cudnn(q, k, v, True)
            _try_once(fn, (q, k, v))
            return Made(fn, (q, k, v))
        except RuntimeError as e:   # else K/V expanded to Hq heads before the call, outside the timing
            g = cell.hq // cell.hkv
            ke, ve = (t.detach().repeat_interleave(g, dim=2).requires_grad_(t.requires_grad) for t in (k, v))
            return Made(cudnn(q, ke, ve, False), (q, ke, ve),
                        f"K/V expanded to {cell.hq} heads before the call (enable_gqa: {str(e)[:80]})")
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        if "fn" not in _FLEX:
            _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        mask = None
        if causal:
            mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, cell.seqlen, cell.seqlen,
                                     device=q.device)
        cap = lambda score, b, h, i, j: SOFTCAP * torch.tanh(score / SOFTCAP)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        flex = _FLEX["fn"]
        return Made(lambda: flex(qt, kt, vt, score_mod=cap, block_mask=mask, enable_gqa=cell.hq != cell.hkv),
                    (q, k, v))
    raise ValueError(f"impl must be one of {ALL_IMPLS}, got {impl!r}")


def _try_once(fn, inputs) -> None:
    """One call of fn, and one backward through it when the inputs need gradients (raises what
    they raise)."""
    import torch
    if not any(t.requires_grad for t in inputs):
        with torch.no_grad():
            fn()
        return
    out = _first(fn())
    torch.autograd.grad(out, inputs, torch.ones_like(out))


def _first(x):
    """Some libraries return (out, lse): keep the output."""
    return x[0] if isinstance(x, (tuple, list)) else x


def _inputs(cell: Cell, device: str, requires_grad: bool):
    import torch
    g = torch.Generator(device=device).manual_seed(0)
    mk = lambda h: torch.randn(cell.batch, cell.seqlen, h, cell.headdim, device=device, dtype=torch.bfloat16,
                               generator=g).requires_grad_(requires_grad)
    return mk(cell.hq), mk(cell.hkv), mk(cell.hkv)


def _prepare(cell: Cell, rows, device: str, backward: bool, skipped: dict, notes: dict):
    """Each row's timed callable, after one untimed call (which compiles); a row that raises is
    reported in skipped and left out, the others go on."""
    import torch
    fns = {}
    for impl, mode in rows:
        key = f"{impl}/{mode}"
        try:
            q, k, v = _inputs(cell, device, backward)
            made = _make(impl, mode, cell, q, k, v)
            if not backward:
                def fwd(fn=made.fn):
                    with torch.no_grad():
                        return fn()
                fwd()
                fns[key] = fwd
            else:
                out = _first(made.fn())
                dout = torch.randn_like(out)
                fns[key] = lambda out=out, x=made.grad_inputs, dout=dout: torch.autograd.grad(
                    out, x, dout, retain_graph=True)
                fns[key]()
            if made.note:
                notes[key] = made.note
        except Exception as e:  # noqa: BLE001 - report and keep timing the other rows
            skipped[key] = f"{type(e).__name__}: {str(e)[:300]}"
            protocol.progress(f"  skip {key} {'bwd' if backward else 'fwd'}: {skipped[key]}")
    if device == "cuda":
        torch.cuda.synchronize()
    return fns


def _wall_timer(fns: dict, timing: protocol.Timing) -> dict:
    """protocol.time_alternating's rounds on the host clock: the --device cpu harness check only."""
    for name in fns:
        for _ in range(timing.warmup):
            fns[name]()
    per = {n: [] for n in fns}
    for order in timing.round_orders(list(fns)):
        for name in order:
            t0 = time.perf_counter()
            for _ in range(timing.iters):
                fns[name]()
            per[name].append((time.perf_counter() - t0) * 1e3 / timing.iters)
    return {n: statistics.median(v) for n, v in per.items()}


def _timed_with_clocks(timer, fns, timing, device) -> tuple[dict, dict]:
    """(times, {name: mean SM clock / power / event reasons}) of one direction's rounds: nvidia-smi
    sampled beside the timing (bench/tools/clocks.py), averaged over each row's segments; the clock
    a row ran at depends on the power its neighbours drew (docs/MEASURED.md fwd-peak-power).  No
    clocks on the CPU harness or without nvidia-smi."""
    if device != "cuda":
        return timer(fns, timing), {}
    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import clocks
    with clocks.Sampler(period_ms=20) as sampler:
        times = timer(fns, timing)
    return times, clocks.per_name(sampler.samples(), protocol.last_segments())


def run_cell(cell: Cell, opts: dict, out_path: str) -> dict:
    """Time every row of a cell, forward then backward; writes out_path after each direction (a
    crash in the backward keeps the forward)."""
    import torch
    device = opts.get("device", "cuda")
    impls = opts.get("impls") or ALL_IMPLS
    rows = cell_rows(cell, impls)
    res = {"cell": cell.name, **_versions(device), "rows": [], "skipped": {}, "notes": {}, "loops": {},
           "seconds": {}}
    timer = protocol.time_alternating if device == "cuda" else _wall_timer
    for direction in DIRECTIONS:
        warmup, iters = loop_sizes(cell.shape, direction)
        warmup = opts.get("warmup") or warmup
        iters = opts.get("iters") or iters
        timing = protocol.Timing(warmup, opts.get("rounds", 5), iters, order=opts.get("order", "shuffle"))
        res["loops"][direction] = {"warmup": warmup, "iters": iters, "rounds": timing.rounds}
        t0 = time.time()
        skipped, notes = {}, {}
        fns = _prepare(cell, rows, device, direction == "bwd", skipped, notes)
        t1 = time.time()
        times, clock = _timed_with_clocks(timer, fns, timing, device) if fns else ({}, {})
        res["seconds"][direction] = {"prepare": round(t1 - t0, 2), "timing": round(time.time() - t1, 2)}
        res["skipped"][direction] = skipped
        res["notes"].update(notes)
        for impl, mode in rows:
            ms = times.get(f"{impl}/{mode}")
            if ms is None:
                continue
            row = {"impl": impl, "mode": mode, "direction": direction, **cell.shape, "ms": float(f"{ms:.5g}"),
                   "tflops": float(f"{tflops(cell.shape, direction, ms):.4g}"), "cell": cell.name,
                   "reference": mode != cell.mode}
            if f"{impl}/{mode}" in notes:
                row["note"] = notes[f"{impl}/{mode}"]
            if f"{impl}/{mode}" in clock:   # mean SM clock / board power over the row's timed segments
                c = clock[f"{impl}/{mode}"]
                row.update(sm_mhz=round(c["sm_mhz"]), power_w=round(c["power_w"], 1), clock_reasons=c["reasons"])
            res["rows"].append(row)
        del fns
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        _write_atomic(out_path, res)
    return res


def run_cells_here(names: list[str], paths: list[str], opts: dict) -> None:
    """The child process: its cells in turn, each into its own JSON.  A cell that raises is
    reported and the next one still runs (its JSON is missing or has one direction: the driver
    marks it failed); the exit status is 1 if any did."""
    import traceback
    if len(names) != len(paths):
        raise SystemExit(f"--run-cell names {len(names)} cells, --cell-json {len(paths)} paths")
    failed = 0
    for name, path in zip(names, paths):
        try:
            run_cell(Cell.parse(name), opts, path)
        except Exception:  # noqa: BLE001 - the next cell of the process still runs
            failed += 1
            print(f"cell {name} failed:\n{traceback.format_exc()}", flush=True)
    if failed:
        raise SystemExit(1)


def _versions(device: str) -> dict:
    import torch
    from importlib.metadata import PackageNotFoundError, version
    try:
        fa4 = version("flash-attn-4")
    except PackageNotFoundError:
        fa4 = None
    dev = torch.cuda.get_device_name() if device == "cuda" else "cpu (harness check, reference backend)"
    cudnn = torch.backends.cudnn.version() if device == "cuda" and torch.backends.cudnn.is_available() else None
    return {"device": dev, "torch": torch.__version__, "fa4": fa4, "cudnn": cudnn}


# ------------------------------------------------------------------------------------ the driver
def child_command(cell, opts: dict, out_path: str) -> list[str]:
    """The child process of one cell, or of a group (a list of cells and a list of JSON paths: the
    process times them in turn, sharing its imports and compiled kernels)."""
    names = ",".join(c.name for c in cell) if isinstance(cell, (list, tuple)) else cell.name
    paths = ",".join(out_path) if isinstance(out_path, (list, tuple)) else out_path
    cmd = [sys.executable, os.path.abspath(__file__), "--run-cell", names, "--cell-json", paths,
           "--device", opts.get("device", "cuda"), "--rounds", str(opts.get("rounds", 5)),
           "--order", opts.get("order", "shuffle")]
    for name in ("warmup", "iters"):
        if opts.get(name):
            cmd += [f"--{name}", str(opts[name])]
    if opts.get("impls"):
        cmd += ["--impls", ",".join(opts["impls"])]
    return cmd


def child_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # FA4's own on-disk compile cache (flash_attn/cute/cache_utils.py, off by default): its kernels
    # are then built once per run instead of once per cell process, as ours are
    env.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    return env


def describe(opts: dict) -> str:
    order = protocol.ORDERS[opts.get("order", "shuffle")]
    warm = (f"{opts['warmup']} warm-up calls" if opts.get("warmup") else
            f"warm-up calls for ~{WARMUP_MS:g} ms ({MIN_WARMUP}-{MAX_WARMUP} calls)")
    seg = (f"{opts['iters']} back-to-back calls" if opts.get("iters") else
           f"back-to-back calls for ~{SEGMENT_MS:g} ms ({MIN_ITERS}-{MAX_ITERS} calls)")
    sized = "" if opts.get("warmup") and opts.get("iters") else (
        f"; loop lengths sized per cell from its FLOP count at a nominal {NOMINAL_TFLOPS:g} TFLOP/s")
    per = opts.get("per_process") or 1
    procs = ("one process per cell" if per == 1 else
             f"cells in processes of up to {per} (consecutive cells of the grid order share imports and "
             f"compiled kernels)")
    return (f"{procs}; inside it, per direction, bench/protocol.py's interleaved rounds: "
            f"{warm} per implementation, then {opts.get('rounds', 5)} rounds of one CUDA-event-timed "
            f"segment of {seg} per implementation, {order}; a row is the median over rounds of the "
            f"per-round mean time{sized}. Forward under no_grad; backward = torch.autograd.grad on a "
            f"retained graph (forward excluded)")


def new_payload(opts: dict, selection: str) -> dict:
    return {"device": None, "date": _dt.date.today().isoformat(), "commit": protocol.commit_id(),
            "torch": None, "fa4": None, "cudnn": None, "protocol": describe(opts), "flops": FLOP_TEXT,
            "peak_tflops": PEAK_TFLOPS, "softcap": SOFTCAP, "dtype": "bfloat16", "selection": selection,
            "cells": [], "rows": []}


def _absorb(payload: dict, cell: Cell, status: dict, res: Optional[dict]) -> None:
    """A finished (or failed) cell into the payload: its rows, its status line and the versions."""
    payload["rows"] = [r for r in payload["rows"] if r["cell"] != cell.name]
    payload["cells"] = [c for c in payload["cells"] if c["cell"] != cell.name]
    if res:
        payload["rows"] += res["rows"]
        for k in ("device", "torch", "fa4", "cudnn"):
            if payload.get(k) is None and res.get(k) is not None:
                payload[k] = res[k]
        if "loops" in res:    # a cell process's output (merge() passes rows and statuses only)
            status.update(skipped={d: s for d, s in res.get("skipped", {}).items() if s},
                          loops=res["loops"], seconds_inside=res.get("seconds"))
    payload["cells"].append(status)


def estimate_cell_s(cell: Cell, impls=ALL_IMPLS) -> float:
    """A cell's planning estimate without compiles: process start, then every row's set-up and
    loops at the nominal rate (bwd rows also run a forward first)."""
    n = len(cell_rows(cell, impls))
    total = PLAN["process_s"] + PLAN["row_s"] * n * len(DIRECTIONS)
    for d in DIRECTIONS:
        warmup, iters = loop_sizes(cell.shape, d)
        est_ms = flops(cell.shape, d) / (NOMINAL_TFLOPS * 1e9)
        total += n * (warmup + 5 * iters + 2) * est_ms / 1e3
    return total


_RUNNING: list = []   # the cell process in flight (for _stop)


def _stop(signum, frame):
    """SIGTERM / SIGINT of the driver (an outer timeout): end the cell's process group too, which
    has a session of its own and would otherwise keep the GPU busy after the driver is gone."""
    for proc in _RUNNING:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    raise SystemExit(128 + signum)


def run_child(cmd: list[str], timeout: float) -> tuple:
    """(return code or "timeout", its stdout and stderr): the cell's process in a session of its
    own, so that a timeout ends it with every process it started (torch.compile's workers)."""
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    _RUNNING[:] = [proc]
    try:
        log, _ = proc.communicate(timeout=timeout)
        return proc.returncode, log or ""
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            log, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:   # a process outside the group still holds the pipe
            proc.kill()
            log = ""
        return "timeout", (log or "") + f"\n(killed after {timeout:.0f} s)"


def run_cells(cells: list[Cell], opts: dict, out_path: str, selection: str = "") -> dict:
    """Each cell in its own process, in order; the JSON and Markdown are rewritten after every
    cell, the PNGs at the end.  opts: device, impls, rounds, order, warmup, iters (None: the
    policy), budget_s (stop starting cells past it), cell_timeout_s."""
    payload = new_payload(opts, selection)
    tmp = tempfile.mkdtemp(prefix="sweep_cells_")
    handlers = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _run_all(cells, opts, out_path, payload, tmp)
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
        shutil.rmtree(tmp, ignore_errors=True)
    return payload


def groups(cells: list[Cell], per_process: int) -> list[list[Cell]]:
    """Consecutive cells, per_process to a child process (the last group may be shorter)."""
    n = max(1, int(per_process or 1))
    return [cells[i:i + n] for i in range(0, len(cells), n)]


def _run_all(cells: list[Cell], opts: dict, out_path: str, payload: dict, tmp: str) -> None:
    t_start = time.time()
    budget = opts.get("budget_s")
    done = 0
    for group in groups(cells, opts.get("per_process", 1)):
        elapsed = time.time() - t_start
        # one process start per group: the estimate of its later cells leaves it out
        est = (sum(estimate_cell_s(c, opts.get("impls") or ALL_IMPLS) for c in group)
               - PLAN["process_s"] * (len(group) - 1))
        if budget and elapsed + est > budget:
            for rest in cells[done:]:
                _absorb(payload, rest, {"cell": rest.name, "status": "not run (--budget-s)"}, None)
            protocol.progress(f"budget: {len(cells) - done} cells not started ({elapsed:.0f} s used of {budget:g})")
            break
        jsons = [os.path.join(tmp, c.name + ".json") for c in group]
        timeout = cell_timeout = (opts.get("cell_timeout_s") or 600) * len(group)
        if budget:
            timeout = max(30.0, min(timeout, budget - elapsed))
        t0 = time.time()
        if len(group) == 1:
            rc, log = run_child(child_command(group[0], opts, jsons[0]), timeout)
        else:
            rc, log = run_child(child_command(group, opts, jsons), timeout)
        seconds = round((time.time() - t0) / len(group), 1)
        for cell, cell_json in zip(group, jsons):
            done += 1
            res = _read_json(cell_json)
            complete = bool(res) and len(res.get("seconds", {})) == len(DIRECTIONS)
            ok = bool(res) and (rc == 0 or complete)
            # a timeout the budget shortened is the budget's cut, not the cell's failure
            failed = ("not finished (--budget-s)" if rc == "timeout" and timeout < cell_timeout
                      else f"failed (rc={rc})")
            status = {"cell": cell.name, "status": "ok" if ok else failed, "seconds": seconds}
            if len(group) > 1:
                status["process_cells"] = len(group)   # seconds: the process's wall time over its cells
            if not ok:
                status["log_tail"] = log[-800:]
            _absorb(payload, cell, status, res)
            print(f"== [{done}/{len(cells)}] {cell.name}: {status['status']}, {status['seconds']} s", flush=True)
        if log.strip():
            print("   " + log.strip().replace("\n", "\n   "), flush=True)
        write_report(payload, out_path, plots=False)
    for g in goal_summary(cell_results(payload["rows"])):
        print(f"goal {g['goal']}: {g['pass']} pass, {g['fail']} fail, {g['missing']} missing of {g['checked']}"
              + (f"; worst {g['worst']:.3f} ({g['worst_cell']})" if g["worst"] is not None else ""), flush=True)
    write_report(payload, out_path, plots=True)


def _read_json(path: str) -> Optional[dict]:
    """A cell process's output, None when it wrote none (or it does not parse)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_atomic(path: str, payload: dict) -> None:
    """JSON at path through a temporary file and a rename: a process killed mid-write leaves the
    previous version (the driver reads what the cell finished)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    protocol.write_json(tmp, payload)
    os.replace(tmp, path)


def merge(paths: list[str]) -> dict:
    """Several sweep JSONs as one: a cell in a later file replaces the same cell of an earlier one,
    unless the later one did not finish (failed, cut or not run under --budget-s: no rows, or a
    forward without its backward) and the earlier one has rows: a lost cell keeps its last
    measurement rather than erasing it."""
    out = None
    commits = []
    for p in paths:
        part = _read_json(p)
        if part is None or "cells" not in part:
            raise SystemExit(f"--merge: {p} is not a sweep JSON (missing or unreadable)")
        commits.append(part.get("commit"))
        if out is None:
            out = dict(part, rows=[], cells=[])
        measured = {r["cell"] for r in out["rows"]}
        for status in part["cells"]:
            if status.get("status") != "ok" and status["cell"] in measured:
                continue
            rows = [r for r in part["rows"] if r["cell"] == status["cell"]]
            # the commit a cell was timed at (a part that is itself a merge gives its joined list)
            status = dict(status, commit=status.get("commit") or part.get("commit"))
            _absorb(out, Cell.parse(status["cell"]), status, {"rows": rows, **{
                k: part.get(k) for k in ("device", "torch", "fa4", "cudnn")}})
    out["merged_from"] = [{"file": os.path.basename(p), "commit": c} for p, c in zip(paths, commits)]
    # the header names the parts, not the first one: its selection and commit covered only its cells
    out["selection"] = "merged"
    out["commit"] = ", ".join(dict.fromkeys(c for c in commits if c))
    out["date"] = max((_read_json(p) or {}).get("date", "") for p in paths) or out.get("date")
    return out


# ------------------------------------------------------------------------------------ the report
def _f(x, fmt="{:.0f}"):
    return "—" if x is None else fmt.format(x)


def _verdict(res: dict) -> str:
    if not res["goals"]:
        return ""
    failed = [n for n, ok in res["goals"].items() if ok is False]
    missing = [n for n, ok in res["goals"].items() if ok is None]
    only = f" (best = {res['best_of_one']} alone)" if res.get("best_of_one") else ""
    if failed:
        return "FAIL " + ", ".join(failed) + only
    if missing:
        return "n/a " + ", ".join(missing) + only
    return "PASS" + only


TABLE_COLUMNS = {   # mode -> (TFLOP/s columns (key, header), ratio columns (key, header))
    "softmax": ((("ours", "ours"), ("fa4", "FA4"), ("cudnn", "cuDNN")),
                (("vs_best", "ours / best"), ("vs_fa4", "vs FA4"), ("vs_cudnn", "vs cuDNN"))),
    "softcap": ((("ours", "ours"), ("fa4", "FA4"), ("flex", "Flex"), ("ours_softmax", "ours softmax")),
                (("vs_fa4", "vs FA4"), ("vs_flex", "vs Flex"), ("vs_own_softmax", "vs own softmax"))),
    "sigmoid": ((("ours", "ours"), ("ours_softmax", "ours softmax")),
                (("vs_own_softmax", "vs own softmax"),)),
}


def markdown(payload: dict) -> str:
    results = cell_results(payload["rows"])
    lines = [f"# Attention sweep: ours vs FA4, cuDNN, FlexAttention ({payload.get('selection') or 'cells'})", "",
             f"device {payload.get('device')}, {payload.get('date')}, commit {payload.get('commit')}, torch "
             f"{payload.get('torch')}, FA4 (flash-attn-4) {payload.get('fa4')}, cuDNN {payload.get('cudnn')}; "
             f"BF16, softcap {payload.get('softcap', SOFTCAP):g}, default programs (evaluator poly).", ""]
    if payload.get("merged_from"):
        lines += ["Merged from " + ", ".join(f"{m['file']} (commit {m['commit']})" for m in payload["merged_from"])
                  + ".", ""]
        timed = Counter(c.get("commit") for c in payload["cells"] if c.get("status") == "ok")
        if timed:
            lines += ["Cells by the commit they were timed at: " + "; ".join(
                f"{n} at {c or 'unknown'}" for c, n in timed.most_common()) + ".", ""]
    lines += [f"Written by `python bench/sweep.py` (this file is its output; bench/sweep.py's docstring "
              f"defines the grid).", "",
              f"Protocol: {payload['protocol']}.", "",
              f"{payload['flops']}. Peak: {payload['peak_tflops']:g} TFLOP/s (H200 dense BF16); % peak = ours "
              f"/ peak.", "",
              "Ratios are baseline time / our time, from the same process (> 1: ours is faster); "
              "ours / best = the faster of FA4 and cuDNN over ours. \"vs own softmax\" = our softmax "
              "time at the same shape, timed in the same cell, over ours. Table values are TFLOP/s.", ""]
    summary = goal_summary(results)
    lines += ["## Goals (issue 27)", "", "| goal | what | cells | pass | fail | missing | worst (ratio) | where |",
              "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['goal']} | {s['text']} | {s['checked']} | {s['pass']} | {s['fail']} | {s['missing']} "
                     f"| {_f(s['worst'], '{:.3f}')} | {s['worst_cell'] or '—'} |")
    lines += ["", "Goal thresholds: " + "; ".join(f"{g.name}: {g.metric} >= {g.threshold:g}" for g in GOALS)
              + f"; geomean >= {GEOMEAN_GOAL:g}. peak = ours TFLOP/s / {PEAK_TFLOPS:g}.", ""]
    lines += ["## Geometric means", "", "| mode | direction | ratio | geomean | cells |", "|---|---|---|---|---|"]
    for mode in MODES:
        for d in (*DIRECTIONS, "both"):
            for key, head in TABLE_COLUMNS[mode][1] + (("peak", "% peak"),):
                vals = [r["ratios"][key] for r in results
                        if r["mode"] == mode and (d == "both" or r["direction"] == d) and key in r["ratios"]]
                if vals:
                    gm = geomean(vals)
                    val = f"{100 * gm:.1f}%" if key == "peak" else f"{gm:.3f}"
                    lines.append(f"| {mode} | {d} | {head} | {val} | {len(vals)} |")
    cls_rows, need = softmax_classes(results)
    if cls_rows:
        lines += ["", "## Softmax ours / best by class", "",
                  f"What the geomean goal needs: over the {need['cells']} measured cells the geomean is "
                  f"{need['geomean']:.3f}; with every cell below 1.0 raised to parity (no new lead) it would be "
                  f"{need['parity_ceiling']:.3f}; {GEOMEAN_GOAL:g} needs every cell's ratio "
                  f"x{need['uniform_factor']:.3f} on average.", "",
                  "| direction | D | mask | heads | S | cells | geomean | min | max |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {c['direction']} | {c['D']} | {c['mask']} | {c['heads']} | {c['S']} | {c['cells']} | "
                  f"{c['geomean']:.3f} | {c['min']:.3f} | {c['max']:.3f} |" for c in cls_rows]
    for mode in MODES:
        tcols, rcols = TABLE_COLUMNS[mode]
        for d in DIRECTIONS:
            rs = [r for r in results if r["mode"] == mode and r["direction"] == d]
            if not rs:
                continue
            lines += ["", f"## {mode} {d} (TFLOP/s)", "",
                      "| D | mask | Hq/Hkv | B | S | " + " | ".join(h for _, h in tcols) + " | "
                      + " | ".join(h for _, h in rcols) + " | % peak | goals |",
                      "|" + "---|" * (5 + len(tcols) + len(rcols) + 2)]
            for r in rs:
                lines.append(f"| {r['headdim']} | {'causal' if r['causal'] else 'full'} | {r['hq']}/{r['hkv']} | "
                             f"{r['batch']} | {r['seqlen']} | "
                             + " | ".join(_f(r["tflops"].get(k)) for k, _ in tcols) + " | "
                             + " | ".join(_f(r["ratios"].get(k), "{:.2f}") for k, _ in rcols)
                             + f" | {_f(100 * r['ratios']['peak'] if 'peak' in r['ratios'] else None, '{:.0f}%')}"
                             f" | {_verdict(r)} |")
    bad = [c for c in payload["cells"] if c.get("status") != "ok" or c.get("skipped")]
    if bad:
        lines += ["", "## Rows left out, cells not run", "", "| cell | status | rows left out |", "|---|---|---|"]
        for c in bad:
            skipped = "; ".join(f"{d} {k}: {v[:120]}" for d, s in (c.get("skipped") or {}).items()
                                for k, v in s.items())
            last = [x.strip() for x in c.get("log_tail", "").splitlines() if x.strip()]
            status = c["status"] + (f": {last[-1][:150]}" if last else "")
            lines.append(f"| {c['cell']} | {status.replace('|', '/')} | {skipped.replace('|', '/') or '—'} |")
    notes = sorted({f"{r['impl']}: {r['note']}" for r in payload["rows"] if r.get("note")})
    if notes:
        lines += ["", "Notes: " + "; ".join(notes) + "."]
    return "\n".join(lines) + "\n"


def plot(payload: dict, base: str) -> list[str]:
    """PNG per (mode, mask) with data: TFLOP/s against S, a panel per D (rows) and direction
    (columns), a line per implementation (solid: GQA, dashed: MHA)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    results = cell_results(payload["rows"])
    colors = {"ours": "tab:red", "fa4": "tab:blue", "cudnn": "tab:green", "flex": "tab:purple",
              "ours_softmax": "tab:orange"}
    labels = {"ours_softmax": "ours softmax"}
    paths = []
    for mode in MODES:
        for causal in (True, False):
            rs = [r for r in results if r["mode"] == mode and r["causal"] == causal]
            if not rs:
                continue
            dims = sorted({r["headdim"] for r in rs})
            fig, axes = plt.subplots(len(dims), 2, figsize=(10, 3.0 * len(dims)), squeeze=False)
            for i, d in enumerate(dims):
                for j, direction in enumerate(DIRECTIONS):
                    ax = axes[i][j]
                    for key, _ in TABLE_COLUMNS[mode][0]:
                        for gqa in (True, False):
                            pts = sorted((r["seqlen"], r["tflops"][key]) for r in rs
                                         if r["headdim"] == d and r["direction"] == direction
                                         and (r["hq"] != r["hkv"]) == gqa and key in r["tflops"])
                            if pts:
                                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[key],
                                        linestyle="-" if gqa else "--", marker="o" if gqa else "x",
                                        label=f"{labels.get(key, key)} {'GQA' if gqa else 'MHA'}")
                    ax.set_xscale("log", base=2)
                    ticks = sorted({r["seqlen"] for r in rs})
                    ax.set_xticks(ticks, [f"{t // 1024}k" if t >= 1024 else str(t) for t in ticks])
                    ax.minorticks_off()
                    ax.set_ylim(bottom=0)
                    ax.set_title(f"{mode} {direction}, D = {d}, {'causal' if causal else 'full'}", fontsize=9)
                    ax.set_xlabel("S (B x S = 16k)", fontsize=8)
                    ax.set_ylabel("TFLOP/s", fontsize=8)
                    ax.tick_params(labelsize=7)
                    ax.grid(alpha=0.3)
                    if ax.lines:
                        ax.legend(fontsize=6)
            fig.suptitle(f"{payload.get('device')}, commit {payload.get('commit')}, {payload.get('date')}", fontsize=9)
            fig.tight_layout()
            path = f"{base}_{mode}_{'causal' if causal else 'full'}.png"
            fig.savefig(path, dpi=60)
            plt.close(fig)
            paths.append(path)
    return paths


def dumps(payload: dict) -> str:
    """The payload as JSON with one line per cell status and per row (a full grid is ~1500 rows:
    small, and a re-run's diff shows the rows that changed)."""
    head = {k: v for k, v in payload.items() if k not in ("cells", "rows")}
    lines = json.dumps(head, indent=2)[:-2].splitlines()
    for key in ("cells", "rows"):
        items = [f"    {json.dumps(x)}" for x in payload.get(key, [])]
        lines[-1] += ","
        lines += [f'  "{key}": [', ",\n".join(items), "  ]"] if items else [f'  "{key}": []']
    return "\n".join(x for x in lines if x) + "\n}\n"


def write_report(payload: dict, json_path: str, plots: bool = True) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        f.write(dumps(payload))
    md = os.path.splitext(json_path)[0] + ".md"
    with open(md, "w") as f:
        f.write(markdown(payload))
    if plots and payload["rows"]:
        try:
            # the PNGs go to figures/ beside the JSON (bench/results/figures/sweep_*.png, the README's links)
            stem = os.path.splitext(os.path.basename(json_path))[0]
            fig_dir = os.path.join(os.path.dirname(os.path.abspath(json_path)), "figures")
            os.makedirs(fig_dir, exist_ok=True)
            made = plot(payload, os.path.join(fig_dir, stem))
            protocol.progress(f"wrote {json_path}, {md} and {len(made)} PNGs")
        except ImportError as e:
            protocol.progress(f"wrote {json_path} and {md}; no PNGs ({e})")


# ------------------------------------------------------------------------------- the dry run
# Planning costs for --dry-run's time estimate and --budget-s's stop.  The loops at the nominal
# rate matched the timed segments of three H200 runs (127 / 62 / 38 s estimated for 128 / 62 / 32
# s measured); process_s and row_s (a timed row's set-up: inputs, kernel loads, the first calls)
# are fitted to the rest of two of them (84 D = 256 and 42 D = 64 cells, 32 rows per process:
# 483 and 250 s wall, the estimate had been 35-45% short); builds are assumptions (a cold
# compile cache; first_call.md for ours, FA4's CuTe DSL builds of similar size, a compiled Flex
# forward + backward one dynamo + inductor + Triton compile per shape).  Warm caches make it
# an overestimate (7 cached cells: 124 s estimated, 64 s wall).
PLAN = {"process_s": 8.0, "row_s": 0.3, "ours_build_s": 2.5, "fa4_build_s": 4.0, "flex_compile_s": 40.0}


def _ours_keys(cell: Cell, mode: str) -> set:
    """The compile-cache keys of our forward and backward at a cell's shape (resolved on the
    CPU from meta tensors, 132 SMs): forward, backward, pre and post kernels."""
    import torch

    from flash_attn_poly import testing
    from flash_attn_poly.kernels.prepost_launch import PostKey, PreKey
    mk = lambda h: torch.empty(cell.batch, cell.seqlen, h, cell.headdim, dtype=torch.bfloat16, device="meta")
    kw = {"softcap": SOFTCAP} if mode == "softcap" else {}
    plan = testing.plan_for(mk(cell.hq), mk(cell.hkv), mk(cell.hkv), mode, "poly", causal=cell.causal, **kw)
    keys = {("attn_fwd", plan.fwd), ("attn_bwd", plan.bwd), ("post", PostKey("bf16"))}
    needs = mode != "sigmoid"
    if needs or plan.zero_dq_in_pre:
        keys.add(("pre", PreKey("bf16", cell.headdim, needs, needs, "e", plan.zero_dq_in_pre)))
    return keys


def dry_run(cells: list[Cell], impls=ALL_IMPLS, per_process: int = 1) -> dict:
    """Cells, rows and the estimated compiles of a run, without CUDA: ours from the plans (each
    distinct key built once per run: the disk cache serves later cells), FA4 from its compile
    inputs (D, causal, softcap, GQA group: forward, backward, and a pre/post pair per D; its disk
    cache on), Flex a forward and a backward compile per cell."""
    ours, fa4_fwd, fa4_dims, flex = set(), set(), set(), 0
    for c in cells:
        for impl, mode in cell_rows(c, impls):
            if impl == "ours":
                ours |= _ours_keys(c, mode)
            elif impl == "fa4":
                fa4_fwd.add((c.headdim, c.causal, mode == "softcap", c.hq // c.hkv))
                fa4_dims.add(c.headdim)
            elif impl == "flex":
                flex += 2
    fa4 = 2 * len(fa4_fwd) + 2 * len(fa4_dims)
    est = (sum(estimate_cell_s(c, impls) for c in cells) + PLAN["ours_build_s"] * len(ours)
           + PLAN["fa4_build_s"] * fa4 + PLAN["flex_compile_s"] * flex / 2
           - PLAN["process_s"] * (len(cells) - len(groups(cells, per_process))))
    return {"cells": len(cells), "rows": sum(2 * len(cell_rows(c, impls)) for c in cells),
            "ours_builds": len(ours), "ours_by_family": {f: sum(k[0] == f for k in ours)
                                                         for f in ("attn_fwd", "attn_bwd", "pre", "post")},
            "fa4_builds": fa4, "flex_compiles": flex, "estimated_s": est}


# -------------------------------------------------------------------------------------- main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="the subset of one device call: S 1k and 4k, D 128, causal, GQA, every mode and impl")
    p.add_argument("--cells", help="comma-separated globs of cell names to run (of the grid, or of --quick's)")
    p.add_argument("--impls", help=f"comma-separated subset of {','.join(ALL_IMPLS)} (default: all)")
    p.add_argument("--dry-run", action="store_true", help="print the cells and the compile estimate; no CUDA")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="write one report from these sweep JSONs (CPU)")
    p.add_argument("--budget-s", type=float, help="start no cell that would end past this many seconds")
    p.add_argument("--cell-timeout-s", type=float, default=600.0,
                   help="kill a cell's process after this (a group's: this times its cells)")
    p.add_argument("--cells-per-process", type=int, default=1, metavar="N",
                   help="time N consecutive cells in one process (they share its imports, CUDA context and "
                        "compiled kernels: ~12 s of start-up per cell on the H200 at N = 1); default 1")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, help="warm-up calls (default: the per-cell policy)")
    p.add_argument("--iters", type=int, help="calls per timed segment (default: the per-cell policy)")
    p.add_argument("--order", choices=sorted(protocol.ORDERS), default="shuffle")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a harness check on the CPU (ours through the reference backend, host clock; "
                        "no numbers worth keeping)")
    p.add_argument("--run-cell", metavar="NAME", help=argparse.SUPPRESS)    # the driver's child process
    p.add_argument("--cell-json", help=argparse.SUPPRESS)
    protocol.add_json_arg(p, "sweep")
    args = p.parse_args(argv)
    impls = tuple(x.strip() for x in args.impls.split(",") if x.strip()) if args.impls else None
    if impls and set(impls) - set(ALL_IMPLS):
        raise SystemExit(f"--impls: unknown {sorted(set(impls) - set(ALL_IMPLS))}; known: {', '.join(ALL_IMPLS)}")
    for name in ("rounds", "warmup", "iters"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.cells_per_process < 1:
        raise SystemExit(f"--cells-per-process must be >= 1, got {args.cells_per_process}")
    opts = {"device": args.device, "impls": impls, "rounds": args.rounds, "order": args.order,
            "warmup": args.warmup, "iters": args.iters, "budget_s": args.budget_s,
            "cell_timeout_s": args.cell_timeout_s, "per_process": args.cells_per_process}
    if args.run_cell:
        if not args.cell_json:
            raise SystemExit("--run-cell needs --cell-json")
        run_cells_here(args.run_cell.split(","), args.cell_json.split(","), opts)
        return
    if args.merge:
        path = protocol.output_path(args.json, "sweep")
        write_report(merge(args.merge), path)
        return
    cells = select(grid(**QUICK) if args.quick else grid(), args.cells)
    selection = ("quick" if args.quick else "grid") + (f", cells {args.cells}" if args.cells else "")
    if args.dry_run:
        for c in cells:
            loops = {d: loop_sizes(c.shape, d) for d in DIRECTIONS}
            print(f"{c.name}: rows {', '.join(f'{i}/{m}' for i, m in cell_rows(c, impls or ALL_IMPLS))}; "
                  f"warm-up/iters fwd {loops['fwd'][0]}/{loops['fwd'][1]}, bwd {loops['bwd'][0]}/{loops['bwd'][1]}")
        est = dry_run(cells, impls or ALL_IMPLS, args.cells_per_process)
        print(f"{est['cells']} cells ({selection}), {est['rows']} timed rows (forward and backward)")
        print(f"estimated kernel compiles: ours {est['ours_builds']} "
              f"({', '.join(f'{k} {v}' for k, v in est['ours_by_family'].items())}; each key once per run, "
              f"the disk cache serves later cells), FA4 ~{est['fa4_builds']} (its disk cache on), "
              f"Flex {est['flex_compiles']} torch.compile graphs (a forward and a backward per softcap cell)")
        print(f"estimated device wall time: ~{est['estimated_s'] / 60:.1f} min "
              f"(planning costs {PLAN}; {math.ceil(est['estimated_s'] / 520)} device call(s) at --budget-s 520)")
        return
    path = protocol.output_path(args.json, "sweep")
    run_cells(cells, opts, path, selection)


if __name__ == "__main__":
    main()
