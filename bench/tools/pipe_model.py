"""Where a key block's cycles can go, from the SASS of its loop (CPU; no timing of its own).

    python bench/tools/pipe_model.py                          # the default builds below
    python bench/tools/pipe_model.py --only bwd_d64 --knob bwd.p_turns=0+bwd.dq_defer=0
    python bench/tools/pipe_model.py --json bench/results/pipe_model.json

Each build is compiled for sm_90a on the CPU (tests/builds.py, the compile tests' builds) and its
consumer loop is read: the innermost loop that issues HGMMA and MUFU, on its mask-free path (the
build is taken non-causal, and the body of a conditional forward branch inside the loop, the key
tail's masking, is skipped, unless it holds a GEMM or an mbarrier wait: bwd.dq_defer's guard of
its first steps around work every later step does).  Its instructions are sorted into the Hopper pipes with per-SM
rates (thread-ops per clock; MUFU 16 and FFMA 125 and F2FP 63.5 measured by
bench/tools/issue_rates.py, docs/MEASURED.md):

    tensor  HGMMA.64xNxK: 64 N K 2 FLOPs per warpgroup, 4096 FLOP/clk (989 TFLOP/s at 1.83 GHz, 132 SMs)
    mufu    MUFU.*, I2F/F2I, POPC: 16                fma  FFMA/FMUL/FADD/HFMA2/HMUL2/HADD2: 128; IMAD: 64
    alu     FSEL/SEL/LOP3/ISETP/FMNMX/F2FP/PRMT/...: 64
    lsu     shared-memory bytes (LDS/STS/LDSM/STSM, SHFL) at 128 B/clk
    smem    every shared-memory byte of a key block at 128 B/clk: lsu's, the HGMMAs' operands read
            from smem (A's 64 x K when a descriptor, B's N x K once per warpgroup) and what the copy
            engine writes (K / V, or Q / dO / LSE / dsum) or the dQ bulk reduce reads: a hypothesis
            (that tensor-core operand fetch shares the banks' bandwidth), to hold against Nsight
            Compute's shared-memory metrics (bench/tools/ncu_summary.py reads them where present);
            loads count 32 lanes' bytes, an upper bound where lanes share words (the backward's
            LSE / dsum loads read 4 distinct words per warp: one wavefront, not two)
    issue   one warp instruction per clock per scheduler, 4 per SM (uniform-datapath, barrier and
            branch instructions take an issue slot and nothing else)

Two readings per build (one CTA per SM, its consumer warps all running the loop):
  * throughput: cycles per key block each pipe needs for the CTA's warps; the block cannot take
    less than the largest (a bound, reachable only with perfect overlap).
  * lockstep (backward; its two MMA warpgroups meet at a barrier every step): the loop replayed in
    program order, the non-GEMM work between two waits taking its largest pipe's cycles, the
    GEMM groups queued on the tensor pipe from their first HGMMA and waited for at
    WARPGROUP.DEPBAR; loads taken as ready.  Steady-state cycles per step and the tensor pipe's
    busy share: what the order of the step costs with no load, latency or scheduling loss.
    Measured beside it (docs/MEASURED.md bwd-ncu-vs-fa4): D = 64 MHA 57.9% tensor, D = 128 MHA
    75.9%; the model's distance from those is what it does not see.
  * two streams (backward): the same step replayed as the two warpgroups' own streams on one SM,
    each pipe (the tensor pipe too) shared cycle by cycle between the streams with work on it, the
    DS_READY barrier met by both, and p_turns' turn barriers (BAR.SYNC / BAR.ARV on a register id,
    256 threads) honoured: what the warpgroups' order in time costs (`staggered` / `with_turns`
    reorder a step as docs/NOTES_attn_bwd.md's designs, for two_streams(..., stagger=, turns=)).
  * streams (forward): the key-block step of each consumer warpgroup (2 or 3) replayed as its own
    stream (fwd_streams), the non-tensor pipes shared cycle by cycle, the GEMM groups on the tensor
    pipe in issue order ("fifo") or shared between the streams' oldest groups ("shared"), ping-pong
    turns passed round the warpgroups; over start offsets of 0 to 1/n of a lone step, the best
    reading (fwd_model).  No latency, no loads: how close the loop's pipes can come to their
    throughput bound when the warpgroups interleave well; "scores per kcycle" compares builds of
    different tiles (the forward's per key block, the backward's per step).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.dirname(HERE), os.path.join(ROOT, "tests")]
import protocol  # noqa: E402

TENSOR_FLOP_PER_CLK = 4096          # dense BF16 per SM
RATES = {"mufu": 16, "fma": 128, "alu": 64}   # thread-ops per clock per SM
SMEM_BYTES_PER_CLK = 128
SCHEDULERS = 4

_OP = re.compile(r"^(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)")
_HGMMA = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)")
_MUFU = ("MUFU", "I2F", "F2I", "POPC", "FLO", "BREV", "FRND")
_FMA = ("FFMA", "FMUL", "FADD", "HFMA2", "HMUL2", "HADD2", "FFMA2", "FMUL2", "FADD2")
_FMA_HEAVY = ("IMAD", "IMUL")
_ALU = ("FSEL", "SEL", "LOP3", "LOP", "ISETP", "FSETP", "HSETP2", "HSET2", "FMNMX", "HMNMX2", "IMNMX",
        "VIMNMX", "F2FP", "PRMT", "SHF", "LEA", "IADD3", "VIADD", "IABS", "R2P", "P2R", "PLOP3", "MOV",
        "SGXT", "BMSK", "FSWZADD", "F2F")
_LSU_BYTES = {"LDS": 4, "STS": 4, "SHFL": 4}   # bytes per thread unless a .64 / .128 suffix says more


def classify(ins: str) -> tuple[str, float]:
    """(pipe, weight) of one SASS instruction: the weight is in that pipe's units (FLOPs per
    warpgroup for tensor, bytes per warp for lsu, thread-op slots otherwise)."""
    m = _OP.match(ins)
    if not m:
        return "other", 0.0
    op, mods = m.group(1), m.group(2)
    if op == "HGMMA":
        g = _HGMMA.match(ins[ins.index("HGMMA"):])
        return ("tensor", 2.0 * int(g.group(1)) * int(g.group(2)) * int(g.group(3))) if g else ("other", 0.0)
    if op.startswith("U") and op not in ("UMMA",):
        return "uniform", 0.0
    if op in _MUFU:
        return "mufu", 1.0
    if op in _FMA:
        return "fma", 1.0
    if op in _FMA_HEAVY:
        return "fma", 2.0
    if op in _ALU:
        return "alu", 1.0
    if op in ("LDSM", "STSM"):   # .4 / .2: that many 8 x 8 16-bit matrices, 128 B each
        last = mods.rsplit(".", 1)[-1]
        return "lsu", 128.0 * (int(last) if last.isdigit() else 1)
    if op in _LSU_BYTES:
        width = 16 if ".128" in mods else 8 if ".64" in mods else _LSU_BYTES[op]
        return "lsu", 32.0 * width
    return "other", 0.0


def _lines(sass: str):
    from flash_attn_poly.kernels import sass as S
    return S._sass_lines(sass), S._BRA


def _fall_through(body, bra) -> list[str]:
    """A loop body's instructions on its steady-state path: a conditional forward branch to a label
    inside the body is taken (in a mask-free block what it skips is the key tail's masking) unless
    what it skips holds a GEMM or an mbarrier wait (the first steps' guard around work every later
    step does: bwd.dq_defer's deferred dQ and its buffer wait); an unconditional one always."""
    at = {t: j for j, (k, t) in enumerate(body) if k == "label"}
    out, skip_to = [], None
    for j, (k, t) in enumerate(body[:-1]):   # the loop's own backward branch last
        if skip_to is not None:
            if k == "label" and t == skip_to:
                skip_to = None
            continue
        if k != "instr":
            continue
        m = bra.match(t)
        if m and at.get(m.group(2), -1) > j:
            span = [u for kk, u in body[j + 1:at[m.group(2)]] if kk == "instr"]
            if not m.group(1) or not any(u.startswith(("HGMMA", "SYNCS.PHASECHK")) for u in span):
                skip_to = m.group(2)
                continue
        out.append(t)
    return out


def consumer_loop(sass: str) -> list[str]:
    """The consumer's mask-free loop body on its fall-through path (_fall_through): of the
    innermost conditional backward-branch loops holding HGMMA and MUFU, the one whose path has
    the fewest ISETP + FSEL (a masked copy selects per score), then the fewest instructions."""
    from flash_attn_poly.kernels import sass as S
    lines, bra = _lines(sass)
    cands = []
    for start, i in S.conditional_loops(lines):
        body = lines[start:i + 1]
        instrs = [t for k, t in body if k == "instr"]
        if not any(t.startswith("HGMMA") for t in instrs) or not any("MUFU" in t for t in instrs):
            continue
        path = _fall_through(body, bra)
        cands.append((start, i, sum(t.startswith(("ISETP", "FSEL")) for t in path), len(path), path))
    inner = [c for c in cands if not any(c[0] <= o[0] and o[1] <= c[1] and o is not c for o in cands)]
    if not inner:
        raise ValueError("no consumer loop (HGMMA and MUFU in one conditional backward-branch loop)")
    return min(inner, key=lambda c: c[2:4])[4]


def _cycles(use: dict, warps: float) -> dict:
    """SM cycles of per-warp pipe work (thread-op slots; lsu in bytes per warp) for `warps` warps."""
    return {"mufu": use["mufu"] * 32 * warps / RATES["mufu"], "fma": use["fma"] * 32 * warps / RATES["fma"],
            "alu": use["alu"] * 32 * warps / RATES["alu"], "lsu": use["lsu"] * warps / SMEM_BYTES_PER_CLK,
            "issue": use["issue"] * warps / SCHEDULERS}


def gmma_smem_bytes(ins: str) -> float:
    """Shared-memory operand bytes of one warpgroup's HGMMA.64xNxK (16-bit operands): A's 64 x K
    when it comes from smem (a descriptor, not registers), B's N x K once per warpgroup."""
    g = _HGMMA.search(ins)
    if not g:
        return 0.0
    m, n, k = (int(x) for x in g.groups())
    operands = [o.strip() for o in ins[g.start():].split(None, 1)[1].split(",")]
    return (2.0 * m * k if operands[1].startswith("gdesc") else 0.0) + 2.0 * n * k


def throughput(body: list[str], warps: int, tma_bytes: float = 0.0) -> dict:
    """Cycles per loop iteration each pipe needs for `warps` warps running the body (the
    tensor pipe's for their warpgroups' HGMMAs).  smem: every shared-memory byte of the
    iteration at 128 B/clk (the threads' loads / stores, the HGMMAs' smem operands, and
    tma_bytes: what the copy engine writes or the bulk reduce reads there per iteration), a
    hypothesis: that operand fetch for the tensor pipe shares the banks' 128 B/clk."""
    use = {"tensor": 0.0, "mufu": 0.0, "fma": 0.0, "alu": 0.0, "lsu": 0.0}
    gmma_bytes = 0.0
    for ins in body:
        pipe, w = classify(ins)
        if pipe in use:
            use[pipe] += w
        if pipe == "tensor":
            gmma_bytes += gmma_smem_bytes(ins)
    wgs = warps / 4
    cyc = {"tensor": use["tensor"] * wgs / TENSOR_FLOP_PER_CLK, **_cycles({**use, "issue": len(body)}, warps),
           "smem": (use["lsu"] * warps + gmma_bytes * wgs + tma_bytes) / SMEM_BYTES_PER_CLK}
    return {k: round(v, 1) for k, v in cyc.items()}


def lockstep(body: list[str], warps: int, iterations: int = 8, trace: list | None = None) -> dict:
    """The body replayed `iterations` times with every consumer warp in step: returns the
    steady-state cycles per iteration (the mean of the second half) and the tensor pipe's busy
    share over them, plus the longest non-GEMM stretch (between two waits) and what bounds it.
    trace: a list to append the last iteration's events to, (start, end, what) in cycles from
    the iteration's start (work stretches, waits, GEMM groups on the tensor pipe)."""
    wgs = warps / 4
    t = tensor_free = 0.0
    pending = []           # end times of committed GEMM groups, oldest first
    group_start = None
    group_flops = 0.0
    seg = {"mufu": 0.0, "fma": 0.0, "alu": 0.0, "lsu": 0.0, "issue": 0.0}
    ends, busy_marks, stretches = [], [], []
    tensor_busy = 0.0
    last, t0, first_ins = False, 0.0, ""

    def flush():
        nonlocal t, first_ins
        c = _cycles(seg, warps)
        top = max(c, key=c.get)
        if c[top] > 0:
            stretches.append((c[top], top, seg["issue"]))
            if last and trace is not None:
                trace.append((t - t0, t + c[top] - t0, f"work {top}-bound, {seg['issue']:.0f} instrs from {first_ins}"))
        first_ins = ""
        t += c[top]
        for k in seg:
            seg[k] = 0.0

    for it in range(iterations):
        last, t0 = it == iterations - 1, t
        for ins in body:
            pipe, w = classify(ins)
            if pipe == "tensor":
                flush()
                first_ins = ins.split()[0]
                seg["issue"] += 1
                if group_start is None:
                    group_start = t
                group_flops += w
                if "gsb0" in ins:
                    start = max(group_start, tensor_free)
                    dur = group_flops * wgs / TENSOR_FLOP_PER_CLK
                    tensor_free = start + dur
                    tensor_busy += dur
                    pending.append(tensor_free)
                    if last and trace is not None:
                        trace.append((start - t0, tensor_free - t0, f"GEMM {ins.split()[0]} on the tensor pipe"))
                    group_start, group_flops = None, 0.0
                continue
            if ins.startswith("WARPGROUP.DEPBAR"):
                flush()
                n = int(ins.rsplit(",", 1)[-1].strip(), 0)
                before = t
                while len(pending) > n:
                    t = max(t, pending.pop(0))
                if last and trace is not None and t > before:
                    trace.append((before - t0, t - t0, f"wait (<= {n} GEMM groups pending)"))
                continue
            if not first_ins:
                first_ins = ins.split()[0]
            seg["issue"] += 1
            if pipe in ("mufu", "fma", "alu", "lsu"):
                seg[pipe] += w
        flush()
        ends.append(t)
        busy_marks.append(tensor_busy)
    half = iterations // 2
    step = (ends[-1] - ends[half - 1]) / (iterations - half)
    busy = (busy_marks[-1] - busy_marks[half - 1]) / (iterations - half)
    per_iter = len(stretches) // iterations
    worst = max(stretches[-per_iter:]) if per_iter else (0.0, "", 0)
    return {"cycles_per_step": round(step, 1), "tensor_busy": round(busy / step, 3),
            "longest_stretch": round(worst[0], 1), "longest_stretch_bound": worst[1]}


def step_events(body: list[str], wg_warps: int = 4) -> list[tuple]:
    """One warpgroup's step as events: ("work", {pipe: cycles at the SM's full rate}), ("gemm",
    tensor cycles) at each group's last HGMMA, ("wait", n) at WARPGROUP.DEPBAR, ("ds_barrier",) at
    the 256-thread DS_READY barrier (BAR.SYNC 0x1, 0x100), ("turn_wait",) / ("turn_pass",) at p_turns'
    256-thread barriers on a register id (BAR.SYNC / BAR.ARV R, 0x100); bwd.dq_defer's mbarriers, read
    in order after the first GEMM wait: the wait for the dS buffer's readers ("ds_free",), the arrival
    once this warpgroup's dS is in it ("ds_full",), the wait for the last step's whole dS
    ("ds_wait_prev",) and the arrival once the deferred dQ has read it ("dq_done",), as `staggered`
    writes them."""
    out, seg = [], {"mufu": 0.0, "fma": 0.0, "alu": 0.0, "lsu": 0.0, "issue": 0.0}
    flops = 0.0
    waited, ds_waits, ds_arrives = False, 0, 0   # mbarrier operations after the first GEMM wait are dq_defer's

    def flush():
        c = _cycles(seg, wg_warps)
        if max(c.values()) > 0:
            out.append(("work", c))
        for k in seg:
            seg[k] = 0.0

    for ins in body:
        pipe, w = classify(ins)
        seg["issue"] += 1
        if pipe == "tensor":
            flops += w
            if "gsb0" in ins:
                flush()
                out.append(("gemm", flops / TENSOR_FLOP_PER_CLK))
                flops = 0.0
        elif ins.startswith("WARPGROUP.DEPBAR"):
            seg["issue"] -= 1
            flush()
            out.append(("wait", int(ins.rsplit(",", 1)[-1].strip(), 0)))
            waited = True
        elif re.match(r"BAR\.SYNC(\.DEFER_BLOCKING)?\s+0x1,\s*0x100", ins):
            seg["issue"] -= 1
            flush()
            out.append(("ds_barrier",))
        elif re.match(r"BAR\.SYNC(\.DEFER_BLOCKING)?\s+R\d+,\s*0x100", ins):   # p_turns: this warpgroup's turn
            seg["issue"] -= 1
            flush()
            out.append(("turn_wait",))
        elif re.match(r"BAR\.ARV\s+R\d+,\s*0x100", ins):   # p_turns: the other's turn
            seg["issue"] -= 1
            flush()
            out.append(("turn_pass",))
        elif ins.startswith("SYNCS.PHASECHK") and waited:   # dq_defer: DS_FREE, then DS_FULL of the last step
            flush()
            out.append(("ds_free",) if ds_waits == 0 else ("ds_wait_prev",))
            ds_waits += 1
        elif ins.startswith("SYNCS.ARRIVE") and waited and not ins.startswith("@"):
            # dq_defer: DS_FULL by every thread after its dS stores, DS_FREE after the deferred dQ (the
            # pipelines' releases are one predicated arrival per warp)
            flush()
            out.append(("ds_full",) if ds_arrives == 0 else ("dq_done",))
            ds_arrives += 1
        elif pipe in seg:
            seg[pipe] += w
    flush()
    return out


def staggered(events: list[tuple]) -> list[tuple]:
    """The step reordered as docs/NOTES_attn_bwd.md's stagger: at the DS_READY barrier an arrive
    ("ds_full",) and a wait for the dS buffer's previous readers ("ds_free",) before the work that
    writes it; the dQ group after the barrier moves behind the dK group and waits for the other
    warpgroup's dS of the previous step ("ds_wait_prev",), its staging after it."""
    b = next(i for i, e in enumerate(events) if e[0] == "ds_barrier")
    gemms = [i for i in range(b + 1, len(events)) if events[i][0] == "gemm"]
    dq, dk = events[gemms[0]], events[gemms[1]]
    last_work = max(i for i in range(b) if events[i][0] == "work")
    pre = events[:last_work] + [("ds_free",), events[last_work], ("ds_full",)]
    tail = [e for i, e in enumerate(events[b + 1:], b + 1) if i not in gemms[:2]]
    return pre + [dk, ("ds_wait_prev",), dq] + tail + [("dq_done",)]


def with_turns(events: list[tuple]) -> list[tuple]:
    """events with the P block (the first work after the first wait) taken in turns: ("turn_wait",)
    before it, ("turn_pass",) after it, the two warpgroups' P blocks alternating."""
    i = next(j for j, e in enumerate(events) if e[0] == "wait")
    p = next(j for j in range(i, len(events)) if events[j][0] == "work")
    return events[:p] + [("turn_wait",), events[p], ("turn_pass",)] + events[p + 1:]


def replay(prog: list[tuple], starts: list[float], run: int, tensor: str = "shared") -> dict:
    """The streams' replay (two_streams, fwd_streams): stream w runs `prog` `run` times from cycle
    starts[w]; per cycle each non-tensor pipe's capacity is split among the streams with work left
    on it; the tensor pipe runs the committed GEMM groups whole in issue order ("fifo") or shares
    itself among the streams' oldest groups ("shared"); turn barriers pass a token round the
    streams; the DS_READY barrier and dq_defer's mbarriers (the backward's two streams) wait for
    the other stream.  Returns each stream's step end times and the cumulative tensor / MUFU busy
    cycles per cycle."""
    n = len(starts)
    pipes = ("mufu", "fma", "alu", "lsu", "issue")
    st = [dict(pc=0, step=0, rem=None, pending=[], start=starts[w], done=[], full=0, dq=0, bar=0, arrived=0)
          for w in range(n)]
    turn, queue = [0], []
    t, busy, mufu_busy, busy_at, mufu_at = 0.0, 0.0, 0.0, [], []
    while min(s["step"] for s in st) < run and t < 1e7:
        # advance each stream through events that take no time
        for w, s in enumerate(st):
            o = st[1 - w] if n == 2 else None   # the backward's barriers pair the two warpgroups
            while t >= s["start"] and s["step"] < run and s["rem"] is None:
                e = prog[s["pc"]]
                kind = e[0]
                if kind == "work":
                    s["rem"] = dict(e[1])
                    break
                if kind == "gemm":
                    item = [e[1], w]
                    queue.append(item)
                    s["pending"].append(item)
                elif kind == "wait":
                    s["pending"] = [g for g in s["pending"] if g[0] > 0]
                    if len(s["pending"]) > e[1]:
                        break
                elif kind == "ds_barrier":   # barrier n passes once both streams arrived at it
                    s["arrived"] = s["bar"] + 1
                    if o["arrived"] < s["arrived"]:
                        break
                    s["bar"] += 1
                elif kind == "ds_full":
                    s["full"] += 1
                elif kind == "ds_free":
                    if s["step"] >= 2 and o["dq"] < s["step"] - 1:
                        break
                elif kind == "ds_wait_prev":
                    if s["step"] >= 1 and o["full"] < s["step"]:
                        break
                elif kind == "dq_done":
                    s["dq"] += 1
                elif kind == "turn_wait":
                    if turn[0] != w:
                        break
                elif kind == "turn_pass":
                    turn[0] = (w + 1) % n
                s["pc"] += 1
                if s["pc"] == len(prog):
                    s["pc"], s["step"] = 0, s["step"] + 1
                    s["done"].append(t)
        # one cycle of the pipes
        active = [s for s in st if s["rem"] is not None and t >= s["start"]]
        used_mufu = False
        for p in pipes:
            users = [s for s in active if s["rem"][p] > 1e-9]
            used_mufu |= p == "mufu" and bool(users)
            for s in users:
                s["rem"][p] -= 1.0 / len(users)
        for s in active:
            if all(v <= 1e-9 for v in s["rem"].values()):
                s["rem"] = None
                s["pc"] += 1
                if s["pc"] == len(prog):
                    s["pc"], s["step"] = 0, s["step"] + 1
                    s["done"].append(t + 1)
        # the tensor pipe: "shared": each stream's groups in order, the streams' heads sharing it
        # (their HGMMA instructions interleave in issue order rather than group after group)
        if tensor == "fifo":
            heads = queue[:1]
        else:
            heads = [next(g for g in queue if g[1] == w) for w in range(n) if any(g[1] == w for g in queue)]
        for g in heads:
            g[0] -= 1.0 / len(heads)
            if g[0] <= 1e-9:
                g[0] = 0.0
                queue.remove(g)
        busy += 1.0 if heads else 0.0
        mufu_busy += 1.0 if used_mufu else 0.0
        t += 1.0
        busy_at.append(busy)
        mufu_at.append(mufu_busy)
    return {"done": [s["done"] for s in st], "busy_at": busy_at, "mufu_at": mufu_at}


def two_streams(events: list[tuple], stagger: bool, steps: int = 12, turns: bool = False) -> dict:
    """Both MMA warpgroups replayed as two streams on one SM (`replay`, the tensor pipe shared
    between the two streams' oldest unfinished GEMM groups); lockstep: both start together and
    meet at the DS_READY barrier; stagger: `staggered` order, warpgroup 1 starting half a lockstep
    step late.  Returns the steady-state cycles per step (the mean over the second half of the
    steps) and the tensor pipe's busy share."""
    prog = staggered(events) if stagger else events
    prog = with_turns(prog) if turns else prog
    half = lockstep_cycles(events) / 2 if stagger else 0.0
    r = replay(prog, [0.0, half], steps)
    busy_at, (d, d1) = r["busy_at"], r["done"]
    k = steps // 2
    per = (d[steps - 1] - d[k - 1]) / (steps - k)
    tb = (busy_at[int(d[steps - 1]) - 1] - busy_at[int(d[k - 1]) - 1]) / (d[steps - 1] - d[k - 1])
    lag = sum(b - a for a, b in zip(d[k - 1:steps], d1[k - 1:steps])) / (steps - k + 1)
    return {"cycles_per_step": round(per, 1), "tensor_busy": round(tb, 3), "lag": round(lag / per, 2)}


def lockstep_cycles(events: list[tuple]) -> float:
    return two_streams(events, stagger=False)["cycles_per_step"]


def fwd_events(body: list[str]) -> list[tuple]:
    """One forward consumer warpgroup's key-block step as events (step_events' kinds): its GEMM
    groups (S = Q K^T of this block, O += P V of the last), the waits, the work between them and
    the ping-pong turn barriers (BAR.SYNC / BAR.ARV on a register id, 256 threads: this
    warpgroup's turn to issue, then the next one's).  The forward's other mbarrier traffic (K / V
    stages, their releases) is taken as ready."""
    return [e for e in step_events(body) if e[0] in ("work", "gemm", "wait", "turn_wait", "turn_pass")]


def fwd_streams(events: list[tuple], n: int, steps: int = 24, offset: float = 0.0,
                tensor: str = "fifo") -> dict:
    """The forward's n consumer warpgroups replayed as n streams on one SM (`replay`; what
    two_streams does for the backward's two), the GEMM groups run whole in issue order ("fifo":
    what ping-pong's turns are for, the best case) or the streams' oldest groups sharing the
    tensor pipe ("shared": groups issued together interleave instruction by instruction, the worst
    case without turns); turn barriers pass a token round the n warpgroups (ping-pong: 2 or 3
    warpgroups issue their GEMMs in turns; the replay's issue takes no time, so turns order the
    groups but do not space them).  Stream w starts at w x offset cycles (0: all at once).
    Returns the steady-state cycles per key block of the CTA (every stream's step; the mean over
    the second half of the steps) and the tensor and MUFU pipes' busy shares over them."""
    # two steps past the measured ones: the window ends with every stream still at work
    r = replay(events, [w * offset for w in range(n)], steps + 2, tensor)
    k = steps // 2
    ends = [max(d[i] for d in r["done"]) for i in range(steps)]
    a, b = ends[k - 1], ends[steps - 1]
    span = lambda xs: (xs[int(b) - 1] - xs[int(a) - 1]) / (b - a)
    return {"cycles_per_block": round((b - a) / (steps - k), 1), "tensor_busy": round(span(r["busy_at"]), 3),
            "mufu_busy": round(span(r["mufu_at"]), 3)}


def fwd_model(events: list[tuple], n: int, tile: tuple) -> dict:
    """fwd_streams over start offsets (all at once, and staggered by 1/n .. of a lone stream's
    step): the best (fewest cycles per block) and every reading, with the pipes' bound."""
    lone = fwd_streams(events, 1, steps=8)["cycles_per_block"]
    runs = {}
    for tensor in ("fifo", "shared"):
        for f in (0.0, 0.25, 0.5, 1.0):
            runs[f"{tensor} offset {f:g}/n"] = fwd_streams(events, n, offset=f * lone / n, tensor=tensor)
    best_key = min(runs, key=lambda r: runs[r]["cycles_per_block"])
    scores = tile[0] * tile[1]
    best = runs[best_key]
    return {"streams": n, "lone_step": lone, "best": best_key, "cycles_per_block": best["cycles_per_block"],
            "tensor_busy": best["tensor_busy"], "mufu_busy": best["mufu_busy"],
            "scores_per_kcycle": round(1000 * scores / best["cycles_per_block"], 1),
            "runs": {k: v["cycles_per_block"] for k, v in runs.items()}}


# (name, mode, evaluator, head dim, shape (B, S, H_q, H_kv), plan overrides)
BUILDS = [
    ("bwd_d64", "softmax", "native", 64, (2, 8192, 32, 32), {}),
    ("bwd_d128", "softmax", "native", 128, (1, 16384, 32, 32), {}),
    ("bwd_d128_softcap", "softcap", "poly", 128, (1, 4096, 32, 8), {}),
    ("fwd_d64_short", "softmax", "native", 64, (32, 512, 32, 32), {}),
    ("fwd_d64", "softmax", "native", 64, (2, 8192, 32, 8), {}),
    ("fwd_d128", "softmax", "native", 128, (1, 4096, 32, 8), {}),
    ("fwd_d128_softcap", "softcap", "poly", 128, (1, 4096, 32, 8), {}),
    ("fwd_d128_softcap_native", "softcap", "native", 128, (1, 4096, 32, 8), {}),
    ("fwd_d64_sigmoid", "sigmoid", "poly", 64, (1, 16384, 32, 8), {}),
    ("bwd_d64_sigmoid", "sigmoid", "poly", 64, (1, 16384, 32, 8), {}),
    ("fwd_d64_softmax_gqa", "softmax", "native", 64, (1, 16384, 32, 8), {}),
    ("bwd_d64_softmax_gqa", "softmax", "native", 64, (1, 16384, 32, 8), {}),
]


def model(name, mode, evaluator, d, shape, overrides, timeline: bool = False) -> dict:
    import builds as B
    p = B.plan(mode, evaluator, d=d, shape=shape, overrides=overrides or None)
    direction = name.split("_")[0]
    cfg = dataclasses.replace(p.fwd if direction == "fwd" else p.bwd, causal=False)
    build = B.fwd(cfg) if direction == "fwd" else B.bwd(cfg)
    body = consumer_loop(build.sass)
    warps = (cfg.tile_m if direction == "fwd" else cfg.tile_n) // 16
    if direction == "fwd":   # K and V tiles of a key block
        tma = 2 * cfg.tile_n * d * 2
    else:                    # Q, dO, LSE and dsum of a query block, the staged dQ tile read back
        tma = 2 * cfg.tile_m * d * 2 + 8 * cfg.tile_m + (cfg.tile_m * d * 4 if cfg.dq_async else 0)
    row = {"build": name, "direction": direction, "mode": mode, "evaluator": evaluator, "head_dim": d,
           "overrides": overrides, "tile": [cfg.tile_m, cfg.tile_n], "consumer_warps": warps,
           "loop_instructions": len(body),
           "mufu_per_thread": sum(classify(i)[0] == "mufu" for i in body),
           "throughput": throughput(body, warps, tma)}
    if direction == "fwd":
        row["streams"] = fwd_model(fwd_events(body), warps // 4, (cfg.tile_m, cfg.tile_n))
    if direction == "bwd":
        trace = [] if timeline else None
        row["lockstep"] = lockstep(body, warps, trace=trace)
        row["two_streams"] = two_streams(step_events(body), stagger=False)
        for a, b, what in trace or ():
            print(f"  {name} {overrides or ''} {a:7.0f} {b:7.0f} {b - a:6.0f}  {what}")
    return row


def markdown(rows) -> str:
    out = ["| build | overrides | tile | warps | loop instrs | MUFU / thread | tensor | mufu | fma | alu | lsu | issue "
           "| smem | lockstep cycles | lockstep tensor busy | longest stretch (bound) | streams cycles "
           "| streams tensor busy | scores per kcycle |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tp, ls = r["throughput"], r.get("lockstep")
        ov = " ".join(f"{k}={v}" for k, v in r["overrides"].items()) or "default"
        head = (f"| {r['build']} | {ov} | {r['tile'][0]}x{r['tile'][1]} | {r['consumer_warps']} | "
                f"{r['loop_instructions']} | {r['mufu_per_thread']} | {tp['tensor']:.0f} | {tp['mufu']:.0f} | "
                f"{tp['fma']:.0f} | {tp['alu']:.0f} | {tp['lsu']:.0f} | {tp['issue']:.0f} | {tp['smem']:.0f} | ")
        if ls:   # backward: per step of the CTA's two warpgroups (tile_m x tile_n scores)
            ts, per = r["two_streams"], ls["cycles_per_step"]
            out.append(head + f"{per:.0f} | {ls['tensor_busy']:.1%} | {ls['longest_stretch']:.0f} "
                       f"({ls['longest_stretch_bound']}) | {ts['cycles_per_step']:.0f} | {ts['tensor_busy']:.1%} | "
                       f"{1000 * r['tile'][0] * r['tile'][1] / ts['cycles_per_step']:.0f} |")
        else:    # forward: per key block of the CTA's warpgroups (fwd_model's best reading; then its
                 # GEMMs interleaved with every warpgroup started at once, the worst case without turns)
            fs = r["streams"]
            out.append(head + f"- | - | - | {fs['cycles_per_block']:.0f} ({fs['best']}); "
                       f"{fs['runs']['shared offset 0/n']:.0f} shared, together | {fs['tensor_busy']:.1%} | "
                       f"{fs['scores_per_kcycle']:.0f} |")
    return "\n".join(out)


def parse_knob(text: str) -> dict:
    """fwd.NAME=VALUE or bwd.NAME=VALUE, several joined by '+' (one row with all of them)."""
    out = {}
    for part in text.split("+"):
        name, _, value = part.partition("=")
        if not name.startswith(("fwd.", "bwd.")) or not value:
            raise SystemExit(f"--knob {text!r}: expected fwd.NAME=VALUE or bwd.NAME=VALUE, joined by '+'")
        v = {"true": True, "false": False}.get(value.lower(), value)
        try:
            v = int(value)
        except ValueError:
            pass
        out[name] = v
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated build names (default: all)")
    ap.add_argument("--knob", action="append", default=[],
                    help="plan override NAME=VALUE: each adds a row per selected build of its direction")
    protocol.add_json_arg(ap, "pipe_model")
    ap.add_argument("--timeline", action="store_true",
                    help="print each backward row's lockstep step: work stretches, waits and GEMM groups")
    args = ap.parse_args(argv)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    only = set(filter(None, args.only.split(",")))
    unknown = only - {b[0] for b in BUILDS}
    if unknown:
        raise SystemExit(f"--only: unknown builds {sorted(unknown)} (known: {[b[0] for b in BUILDS]})")
    rows = []
    for b in BUILDS:
        if only and b[0] not in only:
            continue
        rows.append(model(*b, timeline=args.timeline))
        for k in args.knob:
            ov = parse_knob(k)
            if next(iter(ov)).split(".")[0] == b[0].split("_")[0]:
                try:
                    rows.append(model(b[0], b[1], b[2], b[3], b[4], ov, timeline=args.timeline))
                except ValueError as e:   # the plan refuses the override for this build
                    print(f"{b[0]} {k}: skipped ({e})", flush=True)
        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    md = markdown(rows)
    print(md)
    path = protocol.output_path(args.json, "pipe_model")
    payload = {"date": datetime.date.today().isoformat(), "commit": protocol.commit_id(),
               "tool": "bench/tools/pipe_model.py", "rows": rows}
    protocol.write_results(path, payload, f"# Pipe model of the consumer loops (CPU SASS, {payload['date']}, "
                                          f"commit {payload['commit']})\n\n{protocol.doc_body(__doc__)}\n\n{md}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
