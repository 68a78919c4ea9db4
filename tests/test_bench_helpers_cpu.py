"""CPU tier: the host-side rules the benchmarks depend on (their knobs as plan overrides), and the
bench layout's contracts (job outputs, the commit record, the device round script).  The plan's
default rules (head_loop where its grid fills the GPU, ...) are tests/test_plan_cpu.py's."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path[:0] = [BENCH, os.path.join(BENCH, "tools")]


def _meta_qkv(b, s, h_q, h_kv, d, dtype="bf16"):
    """q, k, v on torch's meta device: plans resolve from their shapes without a GPU (132 SMs)."""
    import torch
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    return tuple(torch.empty(b, s, h, d, dtype=dt, device="meta") for h in (h_q, h_kv, h_kv))


ANCHOR = (1, 4096, 32, 8, 128)


def test_gqa_4096_ratios_pair_the_right_rows():
    """ratios(): baseline time / our time for each named pair; rows keyed by program too, so
    the BF16-program rows never stand in for the default ones."""
    import gqa_4096 as G
    rows = [{"impl": "ours", "mode": "softcap", "evaluator": "poly", "program": "", "fwd_ms": 0.4, "bwd_ms": 1.0},
            {"impl": "ours", "mode": "softcap", "evaluator": "poly", "program": "softcap_c50",
             "fwd_ms": 0.5, "bwd_ms": 1.0},
            {"impl": "fa4", "mode": "softcap", "evaluator": "native", "fwd_ms": 0.8, "bwd_ms": 1.3}]
    r = G.ratios(rows)
    assert r["softcap poly vs FA4 softcap (fwd)"] == pytest.approx(2.0)
    assert r["softcap poly bf16 program vs FA4 softcap (fwd)"] == pytest.approx(1.6)
    assert r["softcap poly bf16 program vs default (f16) (fwd)"] == pytest.approx(0.8)
    assert "sigmoid poly vs FA4 softmax (fwd)" not in r        # rows absent: no ratio


def test_poly_split_configs_are_valid_plans():
    """bench/tools/poly_split.py's configs resolve to plans (program in the table, split legal
    for the forward's key block, grad rule known) whose forward and backward kernels build, and
    the plan runs what the config names."""
    pytest.importorskip("cutlass")
    import plan_knobs
    import poly_split
    from flash_attn_poly.kernels import attn_bwd_sm90 as B, attn_fwd_sm90 as A
    for mode, prog, split, *tuning in poly_split.CONFIGS:
        knob = poly_split.knob(prog, split, *tuning)
        plan = plan_knobs.plan_for(*_meta_qkv(*ANCHOR), mode, "poly" if prog else "native", knob, causal=True,
                                   softcap=50.0 if mode == "softcap" else None)
        if prog:
            assert plan.score.program.name == prog and plan.score.poly_split == split, (prog, split, plan.score)
        if "grad_rule" in knob.overrides:
            assert plan.score_bwd.grad_rule == knob.overrides["grad_rule"]
        for name, value in knob.overrides.items():
            if name.startswith("fwd."):
                assert getattr(plan.fwd, name[4:]) == value, (name, plan.fwd)
        A.kernel_for(plan.fwd)
        B.kernel_for(plan.bwd)


def test_call_timeline_splits_kernel_idle_and_host_late_time():
    """call_timeline.split_trace on a synthetic trace: 2 calls of (memset, main), each main
    launched 4 us after the memset ended (host-late) and started 6 us after it (idle)."""
    import call_timeline as C
    ev, t, corr = [], 0.0, 0
    for _ in range(2):
        for name, dur, launch_after_prev_end in (("void at::native::vectorized_elementwise_kernel<4>", 10.0, -3.0),
                                                 ("kernel_AttnBwdSm90Head", 100.0, 4.0)):
            corr += 1
            start = t + 6.0
            ev.append({"cat": "cuda_runtime", "name": "cuLaunchKernel", "ts": t + launch_after_prev_end, "dur": 2.0,
                       "args": {"correlation": corr}})
            ev.append({"cat": "kernel", "name": name, "ts": start, "dur": dur, "args": {"correlation": corr}})
            t = start + dur
    r = C.split_trace(ev, 2)
    assert r["kernels_per_call"] == 2.0 and r["kernel_us"] == 110.0
    assert r["idle_us"] == 9.0                      # 3 gaps of 6 us over 2 calls (the first has none before it)
    assert r["host_late_us"] == 4.0                 # the two mains' 4 us (memset launches were early)
    assert "6.0->main" in r["gaps"] and "6.0->memset" in r["gaps"]


def test_clock_samples_parse_and_join_by_segment():
    """bench/clocks.py: nvidia-smi lines parse (bad ones dropped), and each name's mean SM
    clock / power and OR of event reasons come from the samples inside its segments only."""
    import datetime as dt

    import clocks
    t0 = dt.datetime(2026, 11, 30, 5, 0, 0)
    line = lambda s, mhz, w, r: f"{(t0 + dt.timedelta(seconds=s)).strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {mhz}, {w}, {r}"
    text = [line(0.00, 1980, 300.0, "0x0"), line(0.05, 1755, 690.5, "0x4"), "garbage, 1, 2",
            line(0.10, 1500, 700.0, "0x0000000000000080"), line(0.30, 1980, 80.0, "0x1")]
    samples = [s for s in map(clocks.parse_line, text) if s]
    assert len(samples) == 4 and samples[1].sm_mhz == 1755 and samples[2].reasons == 0x80
    base = t0.timestamp()
    segs = [("a", base - 0.01, base + 0.06), ("b", base + 0.08, base + 0.12), ("a", base + 0.2, base + 0.25),
            ("c", base + 0.5, base + 0.6)]
    st = clocks.per_name(samples, segs)
    assert set(st) == {"a", "b"}                       # "c" saw no sample
    assert st["a"]["samples"] == 2 and st["a"]["sm_mhz"] == (1980 + 1755) / 2 and st["a"]["reasons"] == "0x4"
    assert st["b"]["sm_mhz"] == 1500 and st["b"]["power_w"] == 700.0 and st["b"]["reasons"] == "0x80"


def test_sampler_without_nvidia_smi_records_nothing(monkeypatch):
    """No nvidia-smi (CPU machine): the sampler is a no-op and the join is empty."""
    import clocks
    monkeypatch.setattr(clocks.shutil, "which", lambda name: None)
    with clocks.Sampler() as s:
        pass
    assert s.samples() == [] and clocks.per_name(s.samples(), [("x", 0.0, 1e12)]) == {}


def test_clock_line_without_reasons_field():
    """An nvidia-smi without the event-reasons field: three columns, reasons read as 0."""
    import clocks
    s = clocks.parse_line("2026/11/30 05:00:00.250, 1830, 650.25")
    assert s is not None and s.sm_mhz == 1830 and s.power_w == 650.25 and s.reasons == 0
    assert clocks.parse_line("2026/11/30 05:00:00.250, [N/A], 650.25") is None


def test_round_orders_alternate_and_shuffle():
    """The seed order is listed, reversed, listed...; shuffle gives permutations that are
    seeded (same every run) and not all the same; the protocol text names the order."""
    import protocol
    names = [f"r{i}" for i in range(8)]
    alt = protocol.Timing(rounds=3).round_orders(names)
    assert alt == [names, names[::-1], names]
    t = protocol.Timing(rounds=6, order="shuffle")
    orders = t.round_orders(names)
    assert all(sorted(o) == names for o in orders)
    assert orders == t.round_orders(names)
    assert len({tuple(o) for o in orders}) > 1
    assert "listed, reversed" in protocol.Timing().describe()
    assert "random permutation" in t.describe() and "alternates" not in t.describe()
    with pytest.raises(ValueError, match="order"):
        protocol.Timing(order="random")


def test_gqa_4096_select_rows():
    import gqa_4096 as G
    rows = [G.Row(i, "softmax", "native", None) for i in ("ours", "fa4", "sdpa_cudnn")]
    assert [r.impl for r in G.select_rows(rows, "ours, fa4")] == ["ours", "fa4"]
    assert G.select_rows(rows, None) == rows
    with pytest.raises(SystemExit, match="flex"):
        G.select_rows(rows, "ours,flex")


def test_gqa_4096_goal_pairs_name_existing_rows():
    """Every goal pair names two rows that all_rows() can build (keys match Row.key)."""
    import gqa_4096 as G
    pairs = G.ratio_pairs()
    for name in G.GOAL_PAIRS:
        base, mine = pairs[name]
        assert G.row_key(base) != G.row_key(mine)
        assert G.row_key(mine).startswith("ours/")
    assert G.row_key(("ours", "softcap", "poly", "softcap_c50")) == "ours/softcap/poly/softcap_c50"
    assert G.ours("softcap", "poly", "softcap_c50").key == "ours/softcap/poly/softcap_c50"
    md = G.pairs_markdown([{"pair": "x", "dir": "fwd", "ratio_median": 1.0, "ratio_min": 0.9,
                            "ratio_max": 1.1, "base_ms": [1.0, 2.0], "ours_ms": [1.0, 1.0]}])
    assert "| x | fwd | 1.000 | 0.900 | 1.100 | 1.500 | 1.000 |" in md


def test_settle_and_pair_clock_columns():
    """Timing(settle_ms) is stated in the protocol text and must be >= 0; the pairwise table
    grows MHz columns only when the pairs carry clock samples."""
    import gqa_4096 as G
    import protocol
    assert "idles 200 ms" in protocol.Timing(settle_ms=200).describe()
    assert "idles" not in protocol.Timing().describe()
    with pytest.raises(ValueError, match="settle_ms"):
        protocol.Timing(settle_ms=-1)
    p = {"pair": "x", "dir": "bwd", "ratio_median": 1.0, "ratio_min": 1.0, "ratio_max": 1.0,
         "base_ms": [1.0], "ours_ms": [1.0]}
    assert "MHz" not in G.pairs_markdown([p])
    md = G.pairs_markdown([dict(p, base_sm_mhz=[1800.0, 1900.0], ours_sm_mhz=[1700.0])])
    assert "| x | bwd | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 | 1850 | 1700 |" in md


ALL_MODES = (("softmax", "native"), ("softcap", "native"), ("softcap", "poly"), ("sigmoid", "poly"))
FWD_KNOBS = [(k, ALL_MODES) for k in ("num_stages=3+o_smem=0", "pingpong=0", "tile_n=64+num_stages=4", "rescale_threshold=0",
                                      "persistent=0", "split=1/8", "fwd.tile_m=192+tile_n=64+num_stages=4+pingpong=0",
                                      "tile_m=128+tile_n=128+num_stages=2+row_sum_carry=1+pingpong=1")]
# ping-pong pairs two consumer warpgroups: BF16 softcap's three-warpgroup default needs the tile too
FWD_KNOBS.append(("row_sum_carry=1+pingpong=1", (("softmax", "native"), ("sigmoid", "poly"))))
FWD_KNOBS.append(("program=softcap_c50_f16_odd+split=1/8", (("softcap", "poly"),)))
FWD_KNOBS.append(("split=1/4", (("softcap", "poly"),)))      # the exp2 offload: 2 of 8 groups on the FMA pipe


def test_score_knobs_on_a_native_score_are_refused():
    """A grad rule (or a split) on a score with no block columns would be dropped silently: the
    tool refuses it, naming the program to add."""
    import plan_knobs
    kw = dict(causal=True, softcap=50.0)
    with pytest.raises(ValueError, match="program="):
        plan_knobs.plan_for(*_meta_qkv(*ANCHOR), "softcap", "poly", plan_knobs.parse("softcap_grad=value"), **kw)
    with pytest.raises(ValueError, match="program="):
        plan_knobs.plan_for(*_meta_qkv(*ANCHOR), "softcap", "native", plan_knobs.parse("split=1/4"), **kw)


@pytest.mark.parametrize("knob,modes", FWD_KNOBS)
def test_fwd_tuning_knobs_build_valid_configs(knob, modes):
    """bench/tools/fwd_tuning.py's knob syntax makes plans whose forward kernel builds (softcap 50,
    BF16, the anchor shape), with the overridden fields set, for the modes it applies to: a knob
    the forward lost fails here, not on the device.  A split on BF16 softcap's exp2 offload sets
    its exp2_fma column groups."""
    pytest.importorskip("cutlass")
    import fwd_tuning  # noqa: F401  (the tool imports)
    import plan_knobs
    from flash_attn_poly.kernels import attn_fwd_sm90 as A
    for mode, ev in modes:
        kn = plan_knobs.parse(knob, "fwd")
        if ev != "poly" and kn.poly_only:
            continue                                   # score knobs need a poly score (the tool skips)
        kw = dict(causal=True, softcap=50.0 if mode == "softcap" else None)
        plan = plan_knobs.plan_for(*_meta_qkv(*ANCHOR), mode, ev, kn, **kw)
        for name, value in kn.overrides.items():
            if name.startswith("fwd."):
                assert getattr(plan.fwd, name[4:]) == value, (name, plan.fwd)
        if "poly_split" in kn.overrides:
            j, k = kn.overrides["poly_split"]
            if plan.score.evaluator == "poly":
                assert plan.score.poly_split == (j, k)
            else:   # the exp2 offload (BF16 softcap's default): its split is exp2_fma's groups of 8
                assert plan.score.program.is_exp2 and plan.fwd.exp2_fma == 8 * j // k, plan.fwd
        A.AttnFwdSm90(plan.fwd)


def test_wg_blocks_counts_windows_against_rows():
    """bench/tools/wg_blocks.count's tile range, with a left window and top- or bottom-aligned tiles,
    equals the key blocks the union of each tile's real rows sees (row r: keys [r - left, r]), counted
    row by row."""
    import wg_blocks as W
    def brute(S, tm, tn, left, bottom):
        shift = (-S) % tm if bottom else 0
        total = 0
        for m in range(-(-(S + shift) // tm)):
            rows = [r for r in range(m * tm - shift, (m + 1) * tm - shift) if 0 <= r < S]
            lo = min(max(r - left, 0) if left >= 0 else 0 for r in rows)
            hi = max(rows) + 1
            total += (tm // W.ROWS_PER_WG) * (-(-hi // tn) - lo // tn)
        return total
    for S, tm, tn, left in [(1000, 192, 64, 300), (1000, 192, 64, 47), (1300, 192, 128, 200), (777, 128, 64, -1),
                            (8192, 192, 64, 4095)]:
        for bottom in (False, True):
            assert W.count(S, tm, tn, True, 1, bottom, left)[0] == brute(S, tm, tn, left, bottom), (S, tm, tn, left, bottom)


def test_plan_knobs_inputs_scale_q_only():
    """plan_knobs.inputs: --q-std scales q (the scores' spread) and leaves k, v and dO as the
    default draw; a tool without the option draws as before."""
    import argparse
    import torch
    import plan_knobs
    base = argparse.Namespace(batch=1, seqlen=8, hq=2, hkv=1, headdim=64)
    ref = plan_knobs.inputs(base, 4, "cpu")
    out = plan_knobs.inputs(argparse.Namespace(**vars(base), q_std=4.0), 4, "cpu")
    assert torch.equal(out[0].float(), ref[0].float() * 4)
    assert all(torch.equal(a, b) for a, b in zip(out[1:], ref[1:]))
    assert torch.equal(plan_knobs.inputs(argparse.Namespace(**vars(base), q_std=1.0), 4, "cpu")[0], ref[0])


def test_plan_knobs_parse_and_name_bad_ones():
    """bench/tools/plan_knobs.py: bare names are the tool's direction's config fields, fwd./bwd.
    name either, split / softcap_grad are the score's overrides, program / deterministic /
    sigmoid_grad attention()'s arguments, zero_dq_in_pre the backward's; bad input names itself."""
    import plan_knobs as P
    assert P.parse("num_stages=3+pingpong=0").overrides == {"fwd.num_stages": 3, "fwd.pingpong": False}
    assert P.parse("rescale_threshold=0.5+persistent=0").overrides == {"fwd.rescale_threshold": 0.5,
                                                                        "fwd.persistent": 0}
    assert P.parse("tile_n=64", "bwd").overrides == {"bwd.tile_n": 64}
    assert P.parse("bwd.stages=1+fwd.tile_n=64").overrides == {"bwd.stages": 1, "fwd.tile_n": 64}
    k = P.parse("deterministic=1+zero_dq_in_pre=0+sigmoid_grad=surrogate", "bwd")
    assert (k.overrides, k.call) == ({"bwd.zero_dq_in_pre": False}, {"deterministic": True, "sigmoid_grad": "surrogate"})
    assert P.parse("bwd.deterministic=1").overrides == {"bwd.deterministic": True}
    assert P.parse("split=1/8").poly_only and not P.parse("num_stages=2").poly_only
    with pytest.raises(ValueError, match="stages: unknown"):
        P.parse("stages=2", "fwd")                     # a BwdConfig field: not the forward's
    with pytest.raises(ValueError, match="fwd.lpt: unknown"):
        P.parse("fwd.lpt=1")
    with pytest.raises(ValueError, match="zero_dq_in_pre: unknown"):
        P.parse("zero_dq_in_pre=1", "fwd")
    with pytest.raises(ValueError, match="tile_n: expected int"):
        P.parse("tile_n=big")
    with pytest.raises(ValueError, match="split: expected J/K"):
        P.parse("split=8")


def test_bwd_tuning_parses_knobs_and_names_bad_ones():
    import bwd_tuning as B
    assert B.parse_knob("head_loop=0+lpt=1").overrides == {"bwd.head_loop": False, "bwd.lpt": True}
    assert B.parse_knob("stages=3+softcap_grad=value").overrides == {"bwd.stages": 3, "grad_rule": "value"}
    k = B.parse_knob("split=1/8+program=softcap_c50_f16_odd")
    assert k.overrides == {"poly_split": (1, 8)} and k.call == {"program": "softcap_c50_f16_odd"}
    with pytest.raises(ValueError, match="mainloop: unknown"):
        B.parse_knob("mainloop=1")
    with pytest.raises(ValueError, match="head_loop: expected 0 or 1"):
        B.parse_knob("head_loop=yes")
    with pytest.raises(ValueError, match="NAME=VALUE"):
        B.parse_knob("lpt")


# each knob bench/tools/bwd_tuning.py documents, with what it must change in the plan
BWD_KNOB_EFFECTS = [
    ("softmax", "native", "head_loop=0", lambda p: not p.bwd.head_loop),
    ("softmax", "native", "dq_async=0", lambda p: not p.bwd.dq_async),
    ("softmax", "native", "lpt=0", lambda p: not p.bwd.lpt),
    ("softmax", "native", "stages=1", lambda p: p.bwd.stages == 1),
    ("softmax", "native", "deterministic=1",
     lambda p: p.bwd.deterministic and not (p.bwd.dq_async or p.bwd.lpt or p.bwd.head_loop)),
    ("softmax", "native", "zero_dq_in_pre=0", lambda p: p.bwd.head_loop and not p.zero_dq_in_pre),
    ("sigmoid", "poly", "sigmoid_grad=surrogate+program=sigmoid_attn_n4096",
     lambda p: p.score_bwd.grad_rule == "surrogate" and p.score_bwd.program.name == "sigmoid_attn_n4096"),
    ("softcap", "poly", "softcap_grad=block+program=softcap_c50_f16",
     lambda p: p.score_bwd.grad_rule == "block" and p.score_bwd.program.name == "softcap_c50_f16"),
    ("sigmoid", "poly", "split=1/8", lambda p: p.score.poly_split == (1, 8)),
]


@pytest.mark.parametrize("mode,ev,text,effect", BWD_KNOB_EFFECTS, ids=[t for _, _, t, _ in BWD_KNOB_EFFECTS])
def test_bwd_tuning_knobs_change_the_plan(mode, ev, text, effect):
    """Every knob bwd_tuning documents resolves into the plan it times (the anchor shape), changes
    what it names, and the backward kernel builds."""
    pytest.importorskip("cutlass")
    import bwd_tuning as B
    import plan_knobs
    from flash_attn_poly.kernels import attn_bwd_sm90 as K
    kw = dict(causal=True, softcap=50.0 if mode == "softcap" else None)
    default = plan_knobs.plan_for(*_meta_qkv(*ANCHOR), mode, ev, None, **kw)
    plan = plan_knobs.plan_for(*_meta_qkv(*ANCHOR), mode, ev, B.parse_knob(text), **kw)
    assert effect(plan) and not effect(default), (text, plan.bwd, default.bwd)
    K.kernel_for(plan.bwd)


def _ncu_round(folder, builds):
    """A synthetic ncu round: <build>_raw.csv (header, units, values) and <build>_sass.csv."""
    import ncu_summary as N
    pre = "smsp__pcsamp_warps_issue_stalled_"
    for i, b in enumerate(builds):
        head = list(N.METRICS.values()) + [pre + "math_pipe_throttle", pre + "wait", pre + "wait_not_issued"]
        vals = [f"{1000 * (i + 1):,}", "75.0", "40.0", "12.0", "20.0", "38.0", "30", "10", "99"]
        with open(folder / f"{b}_raw.csv", "w") as f:
            f.write("\n".join(",".join(f'"{x}"' for x in row) for row in (head, [""] * len(head), vals)) + "\n")
        sass = [["# source page"], ["Address", "Source", "Instructions Executed", N.SAMPLES],
                ["0x10", "MUFU.EX2 R1, R2", "100", "40"], ["0x20", "HGMMA.64x128x16.F32 R0, gdesc", "100", "10"],
                ["0x30", "DEPBAR.LE SB0, 0x1", "100", "20"], ["0x40", "FFMA R1, R2, R3, R4", "100", "30"],
                ["0x50", "STG.E [R2], R4", "1", "50"]]
        with open(folder / f"{b}_sass.csv", "w") as f:
            f.write("\n".join(",".join(f'"{x}"' for x in row) for row in sass) + "\n")


def test_ncu_summary_on_a_synthetic_round(tmp_path):
    """bench/tools/ncu_summary.py finds every build of a round (forward first), reads the pipe
    shares, splits a forward build's loop samples (shares of the loop summing to 1; the line run
    once is outside the loop) and every build's stall reasons, and writes JSON + Markdown."""
    import ncu_summary as N
    _ncu_round(tmp_path, ["bwd_softmax_native", "softcap_poly", "softmax_native"])
    assert N.discover(str(tmp_path)) == ["softcap_poly", "softmax_native", "bwd_softmax_native"]
    out = tmp_path / "ncu.json"
    assert N.main([str(tmp_path), "--json", str(out)]) == 0
    rows = {r["build"]: r for r in json.load(open(out))["rows"]}
    assert rows["softmax_native"]["cycles"] == 3000.0 and rows["softcap_poly"]["tensor_pct"] == 75.0
    loop = {k[6:]: v for k, v in rows["softcap_poly"].items() if k.startswith("loop: ")}
    assert loop["loop_share_of_samples"] == pytest.approx(100 / 150)
    assert loop["MUFU"] == pytest.approx(0.4) and loop["wait S (DEPBAR 0x1)"] == pytest.approx(0.2)
    assert not any(k.startswith("loop: ") for k in rows["bwd_softmax_native"])
    assert rows["bwd_softmax_native"]["stall: math_pipe_throttle"] == pytest.approx(0.75)
    assert "stall: wait_not_issued" not in rows["bwd_softmax_native"]
    assert (tmp_path / "ncu.md").read_text().count("| softcap_poly |") == 4   # pipes, loop, stalls, phases


def test_ncu_summary_names_a_build_whose_run_failed(tmp_path):
    """A build whose profiled run failed (ncu -i of a report that was never written puts its error
    in the raw CSV) is named in the Markdown and the JSON's "failed", and the other builds are
    still summarised; with no build left the tool exits naming them."""
    import ncu_summary as N
    _ncu_round(tmp_path, ["softmax_native"])
    (tmp_path / "cudnn_x_raw.csv").write_text("==ERROR== cannot open file cudnn_x.ncu-rep\n")
    out = tmp_path / "ncu.json"
    assert N.main([str(tmp_path), "--json", str(out)]) == 0
    res = json.load(open(out))
    assert [r["build"] for r in res["rows"]] == ["softmax_native"]
    assert len(res["failed"]) == 1 and "cudnn_x: no metrics" in res["failed"][0] and "ERROR" in res["failed"][0]
    assert "Not summarised: cudnn_x: no metrics" in (tmp_path / "ncu.md").read_text()
    with pytest.raises(SystemExit):
        N.main([str(tmp_path), "--builds", "cudnn_x", "--json", str(out)])


def test_ncu_summary_reads_shared_memory_metrics_where_present(tmp_path):
    """The optional shared-memory metrics come through where the raw page has them (a value that
    is not a number, or a missing column, leaves the key out) and get their table columns."""
    import ncu_summary as N
    head = list(N.METRICS.values()) + [N.OPTIONAL_METRICS["smem_bank_reads_pct"],
                                       N.OPTIONAL_METRICS["smem_lsu_wavefronts"]]
    vals = ["1,000", "75.0", "40.0", "12.0", "20.0", "38.0", "81.5", "n/a"]
    with open(tmp_path / "bwd_x_raw.csv", "w") as f:
        f.write("\n".join(",".join(f'"{x}"' for x in row) for row in (head, [""] * len(head), vals)) + "\n")
    got = N.raw_metrics(str(tmp_path), "bwd_x")
    assert got["smem_bank_reads_pct"] == 81.5 and "smem_lsu_wavefronts" not in got and got["cycles"] == 1000.0
    md = N.markdown(str(tmp_path), [{"build": "bwd_x", **got}], "")
    assert "smem_bank_reads_pct" in md and "smem_bank_writes_pct" not in md
    assert "device" not in got and "(device not in the report, ncu --set full)" in md


def test_ncu_summary_names_the_reports_device(tmp_path):
    """The Markdown title names the GPU of the reports (ncu's device__attribute_display_name), not
    a fixed one."""
    import ncu_summary as N
    head = list(N.METRICS.values()) + [N.DEVICE_NAME]
    vals = ["1,000", "75.0", "40.0", "12.0", "20.0", "38.0", "NVIDIA H100 80GB HBM3"]
    with open(tmp_path / "bwd_x_raw.csv", "w") as f:
        f.write("\n".join(",".join(f'"{x}"' for x in row) for row in (head, [""] * len(head), vals)) + "\n")
    got = N.raw_metrics(str(tmp_path), "bwd_x")
    assert got["device"] == "NVIDIA H100 80GB HBM3"
    assert N.markdown(str(tmp_path), [{"build": "bwd_x", **got}], "").startswith(
        "# Nsight Compute: one warm launch per build (NVIDIA H100 80GB HBM3, ncu --set full)")


def test_ncu_summary_splits_samples_by_phase(tmp_path):
    """ncu_summary.phases: the main loop is the range of the most executed HGMMA lines widened to
    its closing backward branch (a mbarrier retry loop before it, a peeled first HGMMA and the
    conditional lines inside it stay where they lie); samples before / in / after sum to all."""
    import ncu_summary as N
    _ncu_round(tmp_path, ["k"])
    page = [("MOV R1, c[0x0][0x28]", 384, 5), ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", 500, 300),
            ("@!P0 BRA 0x7f10", 500, 100), ("HGMMA.64x128x16.F32 R0, gdesc[UR4], RZ", 128, 2),
            ("HGMMA.64x128x16.F32 R0, gdesc[UR4], RZ", 1024, 40), ("MUFU.EX2 R1, R2", 1024, 60),
            ("@P1 BRA 0x7f80", 1024, 1), ("FSEL R1, R2, RZ, P0", 64, 7),
            ("HGMMA.64x128x16.F32 R8, gdesc[UR8], R8", 1024, 30), ("ISETP.GE.AND P2, PT, R3, R4, PT", 1024, 3),
            ("@P2 BRA 0x7f40", 1024, 4), ("STG.E.128 [R2], R4", 128, 50), ("EXIT", 128, 1)]
    rows = [["# source page"], ["# Address", "Source", N.SAMPLES, "Instructions Executed"]]
    rows += [[f"0x{0x7f00 + 16 * i:x}", src, str(s), f"{e:,}"] for i, (src, e, s) in enumerate(page)]
    (tmp_path / "k_sass.csv").write_text("\n".join(",".join(f'"{x}"' for x in r) for r in rows) + "\n")
    ph = N.phases(str(tmp_path), "k")
    assert (ph["before_samples"], ph["loop_samples"], ph["after_samples"]) == (407, 145, 51)
    assert ph["loop_lines"] == 7 and ph["loop_executions"] == 1024
    assert ph["before_share"] + ph["loop_share"] + ph["after_share"] == pytest.approx(1.0)
    assert ph["before_top"][0] == ["+0x10", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", 300]
    assert ph["after_top"][0][1] == "STG.E.128 [R2], R4"
    out = tmp_path / "ncu.json"
    assert N.main([str(tmp_path), "--json", str(out)]) == 0
    assert "| k | 0.675 | 0.240 | 0.085 |" in (tmp_path / "ncu.md").read_text()
    # a page without addresses: page order, no branch targets to follow (the HGMMA range alone)
    rows = [rows[0], rows[1][1:]] + [r[1:] for r in rows[2:]]
    (tmp_path / "k_sass.csv").write_text("\n".join(",".join(f'"{x}"' for x in r) for r in rows) + "\n")
    ph = N.phases(str(tmp_path), "k")
    assert ph["loop_lines"] == 5 and ph["loop_samples"] == 40 + 60 + 1 + 7 + 30


def test_ncu_summary_loop_lines_run_as_often_as_the_hgmmas(tmp_path):
    """loop_samples: the key-block loop is the lines executed as often as its HGMMAs (within 10%),
    not the most executed lines, which at short S can be a warp's mbarrier poll outside the loop
    (the D = 64 S = 512 profile's hottest lines were two BSYNCs run 2x as often as any HGMMA)."""
    import ncu_summary as N
    _ncu_round(tmp_path, ["k"])
    page = [("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", 4096, 300), ("BSYNC B0", 4096, 20),
            ("HGMMA.64x128x16.F32 R0, gdesc[UR4], RZ", 1024, 40), ("MUFU.EX2 R1, R2", 1024, 60),
            ("DEPBAR.LE SB0, 0x1", 1000, 25), ("FSEL R1, R2, RZ, P0", 64, 7), ("STG.E.128 [R2], R4", 128, 50)]
    rows = [["# source page"], ["Address", "Source", "Instructions Executed", N.SAMPLES]]
    rows += [[f"0x{0x7f00 + 16 * i:x}", src, f"{e:,}", str(smp)] for i, (src, e, smp) in enumerate(page)]
    (tmp_path / "k_sass.csv").write_text("\n".join(",".join(f'"{x}"' for x in r) for r in rows) + "\n")
    loop = N.loop_samples(str(tmp_path), "k")
    assert loop["loop_share_of_samples"] == pytest.approx(125 / 502)
    assert loop["MUFU"] == pytest.approx(60 / 125) and loop["wait S (DEPBAR 0x1)"] == pytest.approx(25 / 125)
    assert "mbarrier wait" not in loop and "rest of the stage" not in loop


def test_commit_is_recorded_outside_a_checkout(tmp_path, monkeypatch):
    """protocol.commit_id: FAP_COMMIT wins; in the checkout, HEAD's short sha (+ -dirty);
    in a copy without .git, the package version + "unknown"."""
    import protocol
    monkeypatch.setenv("FAP_COMMIT", "abc1234")
    assert protocol.commit_id() == "abc1234"
    monkeypatch.delenv("FAP_COMMIT")
    if shutil.which("git") and os.path.isdir(os.path.join(ROOT, ".git")) or os.path.isfile(os.path.join(ROOT, ".git")):
        assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", protocol.commit_id())
    copy = tmp_path / "bench"
    copy.mkdir()
    shutil.copy(os.path.join(BENCH, "protocol.py"), copy / "protocol.py")
    code = "import sys; sys.path.insert(0, sys.argv[1]); import protocol; print(protocol.commit_id())"
    env = {k: v for k, v in os.environ.items() if k != "FAP_COMMIT"}
    got = subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, check=True).stdout.strip()
    assert got == f"{protocol.package_version()}+unknown"


def test_job_outputs_default_to_the_scratch_folder(tmp_path):
    import protocol
    assert protocol.output_path(None, "gqa_4096") == os.path.join(BENCH, "out", "gqa_4096.json")
    explicit = tmp_path / "deep" / "x.json"
    assert protocol.output_path(str(explicit), "gqa_4096") == str(explicit) and explicit.parent.is_dir()
    protocol.write_results(str(explicit), {"a": 1}, "# x\n")
    assert json.load(open(explicit)) == {"a": 1} and (tmp_path / "deep" / "x.md").read_text() == "# x\n"
    ignored = subprocess.run(["git", "check-ignore", "-q", "bench/out/x.json"], cwd=ROOT)
    if ignored.returncode != 128:   # 128: not a git checkout
        assert ignored.returncode == 0, "bench/out/ must be git-ignored"


def _scripts():
    return [os.path.join(d, f) for d in (BENCH, os.path.join(BENCH, "tools"))
            for f in sorted(os.listdir(d)) if f.endswith(".py")]


def test_every_result_writer_defaults_to_the_scratch_folder():
    """A bench script with a --json option declares it through protocol.add_json_arg (default:
    bench/out/<name>.json), never with a committed path as its default."""
    for path in _scripts():
        if path.endswith(os.sep + "protocol.py"):
            continue
        text = open(path).read()
        assert 'add_argument("--json"' not in text, f"{path}: use protocol.add_json_arg"
        assert not re.search(r"default=[^,)]*bench/results", text), f"{path}: a default under bench/results"


def _round_commands():
    """(script, [flags]) of every bench script bench/round.sh runs (python3 or under ncu)."""
    text = open(os.path.join(BENCH, "round.sh")).read().replace("\\\n", " ")
    body = text.split("set -u", 1)[1]
    out = []
    for m in re.finditer(r"(bench/\S+\.py)([^;\n]*)", body):
        out.append((m.group(1), re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", m.group(2))))
    return text, out


def test_round_script_phases_and_commands():
    """bench/round.sh: at most 10 phases, each listed in PHASES and in the header; every script it
    runs exists and defines every flag it passes (argparse flags, or protocol's shared ones)."""
    text, cmds = _round_commands()
    phases = re.search(r'PHASES="([^"]+)"', text).group(1).split()
    assert len(phases) <= 10
    header = text.split("set -u", 1)[0]
    cases = re.findall(r"^    ([a-z_0-9]+)\)", text, re.M)
    assert sorted(cases) == sorted(phases)
    for ph in phases:
        assert re.search(rf"^#   {ph} ", header, re.M), f"phase {ph} has no line in the header"
    shared = {"add_json_arg": ["--json"], "add_shape_args": ["--batch", "--seqlen", "--hq", "--hkv", "--headdim"],
              "add_timing_args": ["--warmup", "--rounds", "--iters"]}
    assert cmds
    for script, flags in cmds:
        path = os.path.join(ROOT, script)
        if script == "bench/tools/first_call.py" and not os.path.exists(path):
            continue                                   # the phase says so when it is absent
        src = open(path).read()
        for mod in re.findall(r"^from (\w+) import", src, re.M):   # a parser built by a sibling module
            sib = [os.path.join(os.path.dirname(path), mod + ".py"), os.path.join(BENCH, mod + ".py")]
            src += "".join(open(f).read() for f in sib if os.path.exists(f) and mod != "protocol")
        known = set(re.findall(r'"(--[a-z][a-z0-9-]*)"', src))
        for helper, names in shared.items():
            if f"protocol.{helper}(" in src:
                known |= set(names)
        assert set(flags) <= known, (script, set(flags) - known)


def test_round_script_runs_every_gpu_test_file():
    """The tests phase picks the files by the gpu marker: every test file with a GPU test has it."""
    tests = os.path.join(ROOT, "tests")
    for f in sorted(os.listdir(tests)):
        if f.startswith("test_") and f.endswith(".py"):
            text = open(os.path.join(tests, f)).read()
            if re.search(r"mark\.gpu\b", text):
                assert "pytest.mark.gpu" in text, f"{f}: round.sh greps for 'pytest.mark.gpu'"


def test_compile_only_reports_progress_per_build(monkeypatch, capsys):
    """gqa_4096.py --compile-only builds every default kernel through tests/sass_catalogue.py
    and prints one progress line per build on stderr (a long CPU job)."""
    import types

    import gqa_4096 as G
    names = {f"{m}_{e}_d128_bf16": {"mode": m} for m, e in G.MODES}
    fake = types.SimpleNamespace(
        builds=lambda: names, fwd_kernel=lambda call: ("fwd", call), bwd_kernel=lambda call: ("bwd", call),
        sass_text=lambda k: "        /*0010*/   MUFU.EX2 R1, R2 ;\n        /*0020*/   HGMMA.64x128x16.F32 R0 ;\n"
                            + ("        /*0030*/   MUFU.TANH R3, R4 ;\n" if k[1]["mode"] == "softcap" else ""))
    monkeypatch.setitem(sys.modules, "sass_catalogue", fake)
    pytest.importorskip("cutlass")
    rep = G.compile_only(128)
    err = capsys.readouterr().err
    assert len(re.findall(r"^\[\d+/10\] ", err, re.M)) == 10
    assert rep["softcap/poly/fwd"]["MUFU.TANH"] == 1 and rep["softmax/native/bwd"]["MUFU.TANH"] == 0
    assert rep["sigmoid/poly/bwd"]["HGMMA"] == 1
    with pytest.raises(SystemExit, match="headdim 96"):
        G.compile_only(96)


@pytest.mark.parametrize("tool", ["fwd_tuning", "bwd_tuning"])
def test_tuning_tools_rows_on_the_cpu(tool, monkeypatch, tmp_path, capsys):
    """fwd_tuning / bwd_tuning end to end on the CPU with the device parts faked (inputs on the
    meta device, dispatch returning a per-plan constant, the timer returning per-row times): which
    rows run (poly-only knobs skipped for native modes), the knob-vs-default differences, the
    ratio rows, and the files written.  What the GPU adds is the kernels and the clock."""
    import importlib
    import torch
    import plan_knobs
    import protocol
    from flash_attn_poly.kernels import dispatch
    T = importlib.import_module(tool)
    direction = tool[:3]
    value = {}                                     # id(plan) -> its fake output value (1, 2, ...)

    def fake_forward(plan, q, k, v):
        return torch.full((2,), float(value.setdefault(id(plan), len(value) + 1))), None
    monkeypatch.setattr(plan_knobs, "inputs", lambda args, n: [*_meta_qkv(*ANCHOR), _meta_qkv(*ANCHOR)[0]][:n])
    monkeypatch.setattr(dispatch, "forward", fake_forward)
    monkeypatch.setattr(dispatch, "backward", lambda plan, do, q, k, v, o, lse: [o * 2, o * 3, o * 4])
    monkeypatch.setattr(protocol, "time_alternating",
                        lambda fns, timing: {n: float(i + 1) for i, n in enumerate(fns)})
    knob = "num_stages=3+o_smem=0" if direction == "fwd" else "head_loop=0"   # 3 stages need the register epilogue
    out = tmp_path / f"{tool}.json"
    assert T.main(["--knob", knob, "--knob", "split=1/2", "--modes", "softmax:native,sigmoid:poly",
                   "--json", str(out)]) == 0
    res = json.load(open(out))
    sep = "/" if direction == "fwd" else ":"
    names = [r["row"] for r in res["rows"]]
    assert names[:5] == [f"softmax{sep}native default", f"softmax{sep}native {knob}", f"sigmoid{sep}poly default",
                         f"sigmoid{sep}poly {knob}", f"sigmoid{sep}poly split=1/2"]
    ratios = {r["row"]: r["ms"] for r in res["rows"][5:]}
    assert ratios == {f"softmax{sep}native {knob} / default": 2.0, f"sigmoid{sep}poly {knob} / default": 4 / 3,
                      f"sigmoid{sep}poly split=1/2 / default": 5 / 3}
    diffs = res["max_abs_diff" if direction == "fwd" else "max_rel_l2_vs_default"]
    assert set(diffs) == {f"softmax:native {knob}", f"sigmoid:poly {knob}", "sigmoid:poly split=1/2"}
    assert all(d > 0 for d in diffs.values())      # every row's fake output differs from its default's
    assert "softmax:native: row 'split=1/2' skipped" in capsys.readouterr().out
    md = (tmp_path / f"{tool}.md").read_text()
    assert md.startswith(f"# {'Forward' if direction == 'fwd' else 'Backward'} knobs ") and "Protocol: " in md
    assert res["shape"] == dict(batch=1, seqlen=8192 if direction == "fwd" else 4096,
                                hq=8 if direction == "fwd" else 32, hkv=4 if direction == "fwd" else 8,
                                headdim=256 if direction == "fwd" else 128)
    with pytest.raises(SystemExit):
        T.main([])                                 # no --knob: a parser error


def test_per_call_tools_rows_on_the_cpu(monkeypatch, tmp_path):
    """kernel_breakdown / call_timeline end to end on the CPU with the device parts faked
    (gqa_4096's prepared calls, the profiler and the timers): every row forward then backward,
    the per-kernel shares and sums, and the files written."""
    import call_timeline as C
    import gqa_4096 as G
    import kernel_breakdown as K
    calls = []
    monkeypatch.setattr(G, "_prepare", lambda rows, args, backward: {
        r: (lambda r=r, b=backward: calls.append((r, b))) for r in rows})
    monkeypatch.setattr(K, "rows_of", lambda args: ["ours softmax", "fa4 softmax"])
    monkeypatch.setattr(C, "_rows", lambda: ["ours softmax"])
    monkeypatch.setattr(K, "profile", lambda fn, warmup, iters: {"main": 3.0, "pre": 1.0})
    assert K.main(["--json", str(tmp_path / "kb.json"), "--iters", "2"]) == 0
    res = json.load(open(tmp_path / "kb.json"))
    assert [(r["row"], r["dir"], r["kernel"], r["share"]) for r in res["rows"][:3]] == [
        ("ours softmax", "fwd", "main", 0.75), ("ours softmax", "fwd", "pre", 0.25), ("ours softmax", "fwd", "(sum)", 1.0)]
    assert [(r["row"], r["dir"]) for r in res["rows"] if r["kernel"] == "(sum)"] == [
        ("ours softmax", "fwd"), ("fa4 softmax", "fwd"), ("ours softmax", "bwd"), ("fa4 softmax", "bwd")]
    assert "20 calls" not in res["protocol"] and "2 calls under torch.profiler" in res["protocol"]
    assert (tmp_path / "kb.md").read_text().startswith("# Per-kernel device time (")
    monkeypatch.setattr(C, "host_us", lambda fn, iters: 5.0)
    monkeypatch.setattr(C, "wall_us", lambda fn, iters: 9.0)
    monkeypatch.setattr(C, "_trace", lambda fn, iters: [])
    monkeypatch.setattr(C, "split_trace", lambda ev, iters: {"kernel_us": 7.0})
    calls.clear()
    assert C.main(["--json", str(tmp_path / "ct.json"), "--warmup", "3"]) == 0
    res = json.load(open(tmp_path / "ct.json"))
    assert res["rows"] == [{"row": "ours softmax", "dir": d, "host_us": 5.0, "wall_us": 9.0, "kernel_us": 7.0}
                           for d in ("fwd", "bwd")]
    assert calls == [("ours softmax", False)] * 3 + [("ours softmax", True)] * 3   # the warm-up calls


def test_tuning_tools_non_causal_rows():
    """--non-causal resolves every row's plan for a non-causal call (the D = 64 forward's turns row
    is causal only, so its default differs there); the report's shape line says which."""
    import types
    import plan_knobs
    q, k, v = _meta_qkv(2, 8192, 32, 8, 64)
    knobs = {"pingpong=1": plan_knobs.parse("pingpong=1", "fwd")}
    for causal in (True, False):
        plans = list(plan_knobs.each_plan(q, k, v, "softmax:native", knobs, [], causal=causal))
        assert [p.call.causal for *_, p in plans] == [causal, causal]
        assert plans[0][2].fwd.mask_bits == causal            # the turns row: causal D = 64 only
    args = types.SimpleNamespace(batch=2, seqlen=8192, hq=32, hkv=8, headdim=64, non_causal=True, window=(-1, -1))
    assert ", non-causal, BF16" in plan_knobs.shape_text(args)


def test_tuning_tools_window_rows():
    """--window LEFT,RIGHT resolves every row's plan for that window (a non-causal window at D = 64
    takes keep words by default, the mask_bits=0 row not); bad values are parser errors."""
    import argparse
    import types
    import plan_knobs
    q, k, v = _meta_qkv(2, 8192, 32, 8, 64)
    knobs = {"mask_bits=0": plan_knobs.parse("mask_bits=0", "fwd")}
    plans = list(plan_knobs.each_plan(q, k, v, "softmax:native", knobs, [], causal=False, window=(48, 16)))
    assert [p.window for *_, p in plans] == [(48, 16)] * 2
    assert [p.fwd.mask_bits for *_, p in plans] == [True, False]
    assert plan_knobs._window("48,16") == (48, 16) and plan_knobs._window("-1,0") == (-1, 0)
    for bad in ("4", "a,b", "-2,3"):
        with pytest.raises(argparse.ArgumentTypeError):
            plan_knobs._window(bad)
    args = types.SimpleNamespace(batch=2, seqlen=8192, hq=32, hkv=8, headdim=64, non_causal=True, window=(48, 16))
    assert ", non-causal, window (48, 16), BF16" in plan_knobs.shape_text(args)


def test_plan_row_names_the_cta_count():
    """A fwd_ctas knob changes no FwdConfig field, only the plan's runtime CTA count: the row it
    would make says so (it is not the default's own config)."""
    pytest.importorskip("cutlass")
    import plan_knobs
    qkv = _meta_qkv(*ANCHOR)
    default = plan_knobs.plan_for(*qkv, "softmax", "native", None, causal=True)
    other = plan_knobs.plan_for(*qkv, "softmax", "native", plan_knobs.parse("fwd_ctas=100", "fwd"), causal=True)
    assert plan_knobs.plan_row(default, other)["sets"] == {"fwd_ctas": 100}
    assert plan_knobs.plan_row(default, default)["sets"] == {}


def test_tuning_cells_builds_every_cell_then_times_each_and_tables_their_ratios(tmp_path):
    """bench/tools/tuning_cells.py: one --compile-only command per cell (the common options and the
    cell's), one timed command per cell writing cell_<i>.json; the table lists each cell's
    "<row> / default" ratios and marks a cell without output by its status."""
    import tuning_cells as TC
    build, timed = TC.commands("fwd", "--headdim 64 --knob pingpong=0", ["--batch 32 --seqlen 512", "--batch 4"],
                               str(tmp_path))
    assert [c[1] for c in build] == [TC.TOOLS["fwd"]] * 2
    assert build[0][2:] == ["--headdim", "64", "--knob", "pingpong=0", "--batch", "32", "--seqlen", "512",
                            "--compile-only"]
    assert timed[1][-4:] == ["--batch", "4", "--json", str(tmp_path / "cell_1.json")]
    (tmp_path / "cell_0.json").write_text(json.dumps({"device": "GPU X", "date": "2026-12-07", "commit": "abc1234",
                                                      "protocol": "5 rounds", "rows": [
        {"row": "softmax/native default", "ms": 0.2}, {"row": "softmax/native pingpong=0", "ms": 0.18},
        {"row": "softmax/native pingpong=0 / default", "ms": 0.9}]}))
    md = TC.markdown("fwd", "--headdim 64", ["--batch 32 --seqlen 512", "--batch 4"], ["ok", "not started (budget)"],
                     str(tmp_path))
    # the table says where and how it ran (the cells' own JSON provenance)
    assert md.startswith("# fwd_tuning cells (GPU X, 2026-12-07, commit abc1234)") and "bench/protocol.py: 5 rounds" in md
    assert TC.provenance(str(tmp_path), 2) == {"device": "GPU X", "date": "2026-12-07", "commit": "abc1234",
                                               "protocol": "5 rounds"}
    assert "| --batch 32 --seqlen 512 | ok | softmax/native pingpong=0 | 0.900 |" in md
    assert "| --batch 4 | not started (budget) | — | — |" in md
    out = subprocess.run([sys.executable, os.path.join(BENCH, "tools", "tuning_cells.py"), "--tool", "bwd",
                          "--args", "--headdim 64", "--cell", "--batch 2", "--dry-run"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == 2 and out[0].endswith("--headdim 64 --batch 2 --compile-only") and "bwd_tuning.py" in out[1]


def test_ab_trees_alternates_trees_and_tables_default_rows_only(tmp_path, monkeypatch):
    """bench/tools/ab_trees.py: per cell a compile command in each tree, then processes old, new,
    new, old; the old tree from its own site (the package's shape) ahead of the current tree's
    PYTHONPATH entries, with its own compile cache; the table's medians come from the default rows
    only (a "<knob> / default" ratio row near 1.0 must not enter them), new / old per mode."""
    import ab_trees as AB
    assert AB.order(1) == ["old", "new"] and AB.order(3) == ["old", "new", "new", "old", "old", "new"]
    old = tmp_path / "old"
    for d in ("flash_attn_poly", "kernels", "asm"):
        (old / d).mkdir(parents=True)
    (old / "flash_attn_poly" / "__init__.py").write_text("")
    root, site = AB.old_layout(str(old), str(tmp_path / "work"))
    pkg = os.path.join(site, "flash_attn_poly")
    assert root == str(old) and sorted(os.listdir(pkg)) == ["__init__.py", "asm", "kernels"]
    assert os.path.realpath(os.path.join(pkg, "kernels")) == os.path.realpath(old / "kernels")
    env = AB.old_env(root, site, "/c", {"PYTHONPATH": os.pathsep.join([AB.SITE_DEFAULT, AB.ROOT, "/payload"])})
    assert env["PYTHONPATH"] == os.pathsep.join([site, root, "/payload"]) and env["FLASH_ATTN_POLY_CACHE_DIR"] == "/c"
    build, timed = AB.commands("bwd", "--knob lpt=1", ["--batch 2"], str(tmp_path), str(old), 2)
    assert [(t, c[-1]) for t, _, c, _ in build] == [("old", "--compile-only"), ("new", "--compile-only")]
    assert build[0][2][1] == os.path.join(str(old), "bench", "tools", "bwd_tuning.py")
    assert [t for t, *_ in timed] == ["old", "new", "new", "old"] and timed[3][3] == str(tmp_path / "c0_old_3.json")

    def res(d, n):   # a bwd_tuning JSON: default rows, a knob row, its ratio row
        return {"rows": [{"row": "softmax:native default", "ms": d}, {"row": "softmax:native lpt=1", "ms": n},
                         {"row": "softmax:native lpt=1 / default", "ms": n / d}]}
    runs = [("old", 0, res(10.0, 10.1)), ("new", 0, res(9.0, 9.1)), ("new", 0, res(9.2, 9.0)),
            ("old", 0, res(10.4, 10.0))]
    rows, md = AB.table(runs, ["--batch 2"])
    assert len(rows) == 12
    assert "| --batch 2 | softmax:native | 10.2000 | 9.1000 | 0.892 | 2 + 2 |" in md, md
    assert "| --batch 2 | old | softmax:native lpt=1 / default | 1.010, 0.962 |" in md, md
    out = subprocess.run([sys.executable, os.path.join(BENCH, "tools", "ab_trees.py"), "--old", str(old), "--tool",
                          "fwd", "--args", "--knob pingpong=0", "--cell", "--batch 4", "--dry-run"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert [ln.split()[0] for ln in out] == ["old", "new", "old", "new", "new", "old"], out


def test_softcap_bound_pairs_each_shape_with_its_softmax_rows():
    """softcap_bound: per shape, FA4 softcap / ours softcap (the goal's ratio) and FA4 softcap /
    ours softmax (the bound), grouped by direction and head dim; a shape without its softmax rows
    is left out, not paired with another shape's."""
    import softcap_bound as SB

    def row(impl, mode, ms, s=1024, d=256, direction="bwd"):
        return dict(impl=impl, mode=mode, direction=direction, batch=16384 // s, seqlen=s, hq=16, hkv=8, headdim=d,
                    causal=True, ms=ms, cell=f"{mode}-d{d}-causal-h16-8-s{s}-b{16384 // s}")
    rows = [row("fa4", "softcap", 3.0), row("ours", "softcap", 2.5), row("ours", "softmax", 2.0),
            row("fa4", "softmax", 2.8),
            row("fa4", "softcap", 9.0, s=2048), row("ours", "softcap", 4.0, s=2048)]   # no softmax rows
    cells = [dict(cell=r["cell"], commit="abc") for r in rows]
    res = SB.analyse({"rows": rows, "cells": cells, "date": "x"})
    (g,) = res["groups"]
    assert (g["direction"], g["headdim"], g["cells"]) == ("bwd", 256, 1), g
    assert g["vs_fa4_softcap"] == [1.2, 1.2] and g["pass"] == 0, g
    assert g["bound"] == [1.5, 1.5] and g["reachable"] == 0, g
    assert g["fa4_softcap_over_softmax"] == [round(3.0 / 2.8, 3)] * 2 and g["commits"] == ["abc"], g
    assert "| bwd | 256 | 1 | 1.20-1.20 | 0 | 1.50-1.50 | 0 |" in SB.markdown(res)


def test_ncu_lines_reads_a_sass_page(tmp_path):
    """bench/tools/ncu_lines.py: shares by opcode (predicates skipped), the hottest line with its
    top stall reason, the MUFU lines' reasons, and an offset range as opcode:samples."""
    import gzip
    import ncu_lines
    head = ["Address", "Source", "# Samples", "Instructions Executed", "stall_wait", "stall_mio",
            "stall_wait (Not Issued)"]
    rows = [("0x100", "FFMA R1, R2, R3, R4", 10, 64, 1, 0, 9), ("0x110", "MUFU.EX2 R1, R1", 30, 64, 20, 10, 0),
            ("0x120", "@!P0  BRA 0x200", 60, 64, 0, 0, 0)]
    path = tmp_path / "k_sass.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write('"Kernel Name","k"\n' + ",".join(f'"{h}"' for h in head) + "\n")
        for r in rows:
            f.write(",".join(f'"{v}"' for v in r) + "\n")
    s = ncu_lines.summary(str(path), 1)
    assert "BRA 0.600" in s and "MUFU 0.300" in s and "FFMA 0.100" in s
    assert "MUFU lines' stall reasons: wait 20, mio 10" in s
    assert s.splitlines()[-1].startswith("+0x00020      60 0.600")
    assert ncu_lines.sequence(str(path), 0x10, 0x20) == "MUFU:30 BRA:60"


# a consumer loop in nvdisasm's layout: two GEMM groups (S, then PV), a masked copy of the loop
# with per-score selects, and a key-tail branch inside the mask-free one
_PIPE_SASS = """
.L_x_1:
        /*0010*/                   FSEL R1, R1, RZ, !P1 ;
        /*0020*/                   FSEL R2, R2, RZ, !P1 ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0040*/                   MUFU.EX2 R3, R3 ;
        /*0050*/               @P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0060*/                   WARPGROUP.ARRIVE ;
        /*0070*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0080*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0090*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*00a0*/                   FFMA R3, R3, R4, -R5 ;
        /*00b0*/                   MUFU.EX2 R3, R3 ;
        /*00c0*/                   MUFU.EX2 R6, R6 ;
        /*00d0*/              @!P2 BRA `(.L_x_3) ;
        /*00e0*/                   FSEL R3, R3, RZ, !P1 ;
        /*00f0*/                   FSEL R6, R6, RZ, !P1 ;
.L_x_3:
        /*0100*/                   F2FP.BF16.F32.PACK_AB R7, R6, R3 ;
        /*0110*/                   STSM.16.MT88.4 [R8], R12 ;
        /*0120*/                   UIADD3 UR4, UR4, 0x10, URZ ;
        /*0130*/                   HGMMA.64x64x16.F32.BF16 R40, R7, gdesc[UR12].tnspB, R40, gsb0 ;
        /*0140*/               @P0 BRA `(.L_x_2) ;
"""


def test_pipe_model_reads_the_mask_free_loop_and_its_pipes():
    """bench/tools/pipe_model.py: the consumer loop is the mask-free copy (fewest selects), the
    key tail's branch is taken, each instruction lands on its pipe with its weight, and the
    lockstep replay waits for the GEMM group at the DEPBAR."""
    import pipe_model as pm
    body = pm.consumer_loop(_PIPE_SASS)
    assert [b.split()[0] for b in body] == ["WARPGROUP.ARRIVE", "HGMMA.64x128x16.F32.BF16", "HGMMA.64x128x16.F32.BF16",
                                           "WARPGROUP.DEPBAR.LE", "FFMA", "MUFU.EX2", "MUFU.EX2",
                                           "F2FP.BF16.F32.PACK_AB", "STSM.16.MT88.4", "UIADD3",
                                           "HGMMA.64x64x16.F32.BF16"]
    assert pm.classify("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT") == ("tensor", 2 * 64 * 128 * 16)
    assert pm.classify("@!P1 MUFU.TANH R3, R3") == ("mufu", 1.0)
    assert pm.classify("IMAD.WIDE R2, R3, 0x4, R4") == ("fma", 2.0)
    assert pm.classify("STSM.16.MT88.4 [R8], R12") == ("lsu", 512.0)
    assert pm.classify("LDS.128 R4, [R2]") == ("lsu", 512.0)
    assert pm.classify("UIADD3 UR4, UR4, 0x10, URZ")[0] == "uniform"
    # smem operand bytes: SS reads A (64 x 16) and B (N x 16), RS only B
    assert pm.gmma_smem_bytes("@P0 HGMMA.64x64x16.F32.BF16 R24, gdesc[UR16].tnspB, RZ, !UPT") == 2 * (64 + 64) * 16
    assert pm.gmma_smem_bytes("HGMMA.64x128x16.F32.BF16 R152, R56, gdesc[UR16].tnspB, R152") == 2 * 128 * 16
    tp = pm.throughput(body, warps=8)   # 2 warpgroups
    assert tp["tensor"] == (2 * 2 * 64 * 128 * 16 + 2 * 64 * 64 * 16) * 2 / 4096
    assert tp["mufu"] == 2 * 32 * 8 / 16 and tp["fma"] == 32 * 8 / 128 and tp["issue"] == 11 * 8 / 4
    # smem: STSM.4 (512 B per warp) x 8 warps, the HGMMAs' operands x 2 warpgroups (S: 2 x (2 + 4) KB SS,
    # PV: 2 KB RS), plus the bytes handed in, at 128 B/clk
    smem = pm.throughput(body, warps=8, tma_bytes=4096)["smem"]
    assert smem == (512 * 8 + 2 * (2 * 6144 + 2048) + 4096) / 128
    ls = pm.lockstep(body, warps=8, iterations=4)
    # per step: the wait takes the previous PV group (64 tensor cycles) and this S group (256)
    # in turn, then the score work: 2 MUFU per thread x 8 warps (32 cycles) bounds the stretch
    # (6 issue slots x 8 warps / 4 = 12); the PV group is left pending for the next wait
    assert ls["longest_stretch_bound"] == "mufu" and ls["longest_stretch"] == 32.0
    assert ls["cycles_per_step"] == 64 + 256 + 32, ls
    assert ls["tensor_busy"] == round(320 / 352, 3), ls
    trace = []
    assert pm.lockstep(body, warps=8, iterations=4, trace=trace) == ls
    waits = [(a, b) for a, b, what in trace if what.startswith("wait")]
    gemms = {b - a: b for a, b, what in trace if what.startswith("GEMM")}
    assert sorted(gemms) == [64.0, 256.0] and len(waits) == 1 and waits[0][1] == gemms[256.0], trace
    assert not any(what.endswith("from ") for a, b, what in trace), trace


def test_pipe_model_two_streams_share_the_pipes_and_take_turns():
    """two_streams: both warpgroups' GEMM groups share the tensor pipe and their MUFU work shares
    MUFU (lockstep: 2 x 100 tensor cycles, then 2 x 100 MUFU cycles per step); P blocks in turns
    overlap one's MUFU with the other's GEMM (the step shortens); step_events reads the turn
    barriers (register ids, 256 threads) and the DS_READY barrier from SASS."""
    import pipe_model as pm
    work = {"mufu": 100.0, "fma": 0.0, "alu": 0.0, "lsu": 0.0, "issue": 1.0}
    events = [("gemm", 100.0), ("wait", 0), ("work", work)]
    lock = pm.two_streams(events, stagger=False, steps=8)
    assert lock["cycles_per_step"] == pytest.approx(400, abs=2) and lock["lag"] == 0.0, lock
    turns = pm.two_streams(events, stagger=False, steps=8, turns=True)
    assert turns["cycles_per_step"] < 0.8 * lock["cycles_per_step"] and turns["lag"] > 0, turns
    ev = pm.step_events(["BAR.SYNC.DEFER_BLOCKING R6, 0x100", "MUFU.EX2 R3, R3", "BAR.ARV R7, 0x100",
                         "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, gsb0"])
    assert [e[0] for e in ev] == ["turn_wait", "work", "turn_pass", "ds_barrier", "work", "gemm"], ev   # HGMMA: a slot
    assert ev[-1][1] == 2 * 64 * 64 * 16 / 4096


def test_pipe_model_forward_streams_queue_gemms_and_pass_turns():
    """fwd_streams: three warpgroups, each a GEMM group of 100 tensor cycles then 100 MUFU cycles
    of work per block.  In issue order ("fifo") the GEMMs run one after another while the first
    warpgroup's work overlaps the later GEMMs: 300 cycles per block of the CTA (the pipes' bound);
    started together and sharing the tensor pipe ("shared": GEMMs issued at once interleave) every
    GEMM ends at 300 and the MUFU work follows (600); a turn ring (BAR.SYNC / BAR.ARV on register
    ids) keeps the bound with staggered starts; fwd_events keeps the turn barriers and drops the
    forward's mbarrier traffic."""
    import pipe_model as pm
    work = {"mufu": 100.0, "fma": 0.0, "alu": 0.0, "lsu": 0.0, "issue": 1.0}
    step = [("gemm", 100.0), ("wait", 0), ("work", work)]
    fifo = pm.fwd_streams(step, 3, steps=12)
    assert fifo["cycles_per_block"] == pytest.approx(300, abs=3) and fifo["tensor_busy"] > 0.97, fifo
    shared = pm.fwd_streams(step, 3, steps=12, tensor="shared")
    assert shared["cycles_per_block"] == pytest.approx(600, abs=6) and shared["tensor_busy"] < 0.55, shared
    turns = pm.fwd_streams([("turn_wait",), ("gemm", 100.0), ("turn_pass",)] + step[1:], 3, steps=12, offset=7.0)
    assert turns["cycles_per_block"] == pytest.approx(300, abs=3), turns   # the order a turn ring keeps
    best = pm.fwd_model(step, 3, (192, 64))
    assert best["cycles_per_block"] == pytest.approx(300, abs=3) and best["best"].startswith("fifo"), best
    assert best["scores_per_kcycle"] == pytest.approx(1000 * 192 * 64 / 300, rel=0.01)
    ev = pm.fwd_events(["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8+0x10], R16", "BAR.SYNC.DEFER_BLOCKING R18, 0x100",
                        "HGMMA.64x64x16.F32.BF16 R88, gdesc[UR8], RZ, !UPT, gsb0", "BAR.ARV R186, 0x100",
                        "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.TANH R19, R19",
                        "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR14+0x30], RZ"])
    assert [e[0] for e in ev] == ["work", "turn_wait", "work", "gemm", "turn_pass", "wait", "work"], ev


def test_pipe_model_ds_barrier_holds_the_leader_and_knobs_join():
    """two_streams' DS_READY barrier passes only once both warpgroups arrived: with P blocks in turns
    the first warpgroup reaches it a P block early and waits, so both leave each step together (lag
    ~0); without the barrier it runs ahead.  parse_knob joins overrides with '+' into one row."""
    import pipe_model as pm
    work = {"mufu": 100.0, "fma": 0.0, "alu": 0.0, "lsu": 0.0, "issue": 1.0}
    step = [("gemm", 100.0), ("wait", 0), ("work", work)]
    held = pm.two_streams(step + [("ds_barrier",)], stagger=False, steps=8, turns=True)
    free = pm.two_streams(step, stagger=False, steps=8, turns=True)
    assert held["lag"] < 0.02 and free["lag"] > 0.2, (held, free)
    assert pm.parse_knob("bwd.p_turns=1+bwd.dq_defer=1") == {"bwd.p_turns": 1, "bwd.dq_defer": 1}
    with pytest.raises(SystemExit):
        pm.parse_knob("bwd.p_turns=1+dq_defer=1")


# a deferred-dQ step (bwd.dq_defer): the first steps' guards around the buffer wait and the dQ GEMM
# (conditional forward branches over an mbarrier wait / a GEMM: the steady state runs them), the
# else part behind an unconditional branch, and the key tail's masking (skipped)
_DEFER_SASS = """
.L_x_1:
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0020*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0030*/                   MUFU.EX2 R3, R3 ;
        /*0040*/              @!P2 BRA `(.L_x_2) ;
        /*0050*/                   FSEL R3, R3, RZ, !P1 ;
.L_x_2:
        /*0060*/              @!P3 BRA `(.L_x_3) ;
        /*0070*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R10+UR7+0x60], R7 ;
.L_x_3:
        /*0080*/                   STSM.16.MT88.4 [R8], R12 ;
        /*0090*/                   SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R6+UR7+0x50], RZ ;
        /*00a0*/                   HGMMA.64x64x16.F32.BF16 R40, R7, gdesc[UR12].tnspB, R40, gsb0 ;
        /*00b0*/              @!P4 BRA `(.L_x_4) ;
        /*00c0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R11+UR7+0x50], R6 ;
        /*00d0*/                   HGMMA.64x64x16.F32.BF16 R56, gdesc[UR16], RZ, !UPT, gsb0 ;
        /*00e0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*00f0*/              @!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR14+0x30], RZ ;
        /*0100*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0110*/                   SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R11+UR7+0x60], RZ ;
        /*0120*/                   BRA `(.L_x_5) ;
.L_x_4:
        /*0130*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0140*/              @!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR14+0x30], RZ ;
.L_x_5:
        /*0150*/               @P5 BRA `(.L_x_1) ;
"""


def test_pipe_model_reads_the_deferred_dq_step():
    """The steady-state path of a dq_defer step: the guarded buffer wait and dQ GEMM are run (their
    forward branches not taken), the masking and the else part skipped; step_events names the
    mbarriers after the first GEMM wait in order (ds_free, ds_full, ds_wait_prev, dq_done) and
    leaves the pipelines' predicated releases out."""
    import pipe_model as pm
    lines, bra = pm._lines(_DEFER_SASS)
    body = pm._fall_through(lines, bra)
    assert not any(x.startswith("FSEL") for x in body), body
    assert sum(x.startswith("HGMMA") for x in body) == 3 and sum(x.startswith("WARPGROUP.DEPBAR") for x in body) == 3
    kinds = [e[0] if e[0] != "wait" else f"wait{e[1]}" for e in pm.step_events(body) if e[0] != "work"]
    assert kinds == ["gemm", "wait0", "ds_free", "ds_full", "gemm", "ds_wait_prev", "gemm", "wait1", "wait0",
                     "dq_done"], kinds


def test_fa4_pack_gqa_arguments():
    """bench/tools/fa4_pack_gqa.py: cells are B,S (positive integers), the heads a GQA group; its
    report's protocol text comes from bench/protocol (nothing runs without CUDA here)."""
    import argparse
    import fa4_pack_gqa as T
    assert T.parse_cell("8,2048") == (8, 2048)
    for bad in ("8", "a,b", "0,2048", "8,-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            T.parse_cell(bad)
    args = T.parser().parse_args(["--cell", "2,8192", "--headdim", "64"])
    assert args.cell == [(2, 8192)] and args.order == "shuffle" and (args.hq, args.hkv) == (32, 8)
    T.check(args)
    for hq, hkv in ((32, 32), (32, 5)):
        with pytest.raises(SystemExit, match="GQA group"):
            T.check(T.parser().parse_args(["--hq", str(hq), "--hkv", str(hkv)]))


def test_window_noop_cells_and_modes():
    import argparse
    import window_noop as W
    assert W.parse_cell("4,4096") == (4, 4096)
    for bad in ("4", "4,2", "0,512", "a,b"):
        with pytest.raises(argparse.ArgumentTypeError):
            W.parse_cell(bad)
    with pytest.raises(SystemExit, match="unknown"):
        W.main(["--modes", "softmax,gelu"])


def test_sigmoid_tail_model_separates_the_thresholds(capsys):
    """The model's known draw (S_k = 130, draw 24 of its seeds): the program's clamp as the MUFU
    threshold misses the rule, the plan's threshold and native hold it."""
    import sigmoid_tail_model as M
    from flash_attn_poly import plan
    from flash_attn_poly.asm import programs
    r = M.one(28, 130, 130024, [12.0, plan.SIGMOID_MUFU_ABOVE], programs.entry("sigmoid_attn_n4096_f16"))
    assert r["T=12"] > 1.0 > 0.8 > r[f"T={plan.SIGMOID_MUFU_ABOVE:g}"] and r["native"] < 0.8
    M.main(["--sk", "130", "--draws", "1", "--threshold", "4"])
    assert "S_k   130 S_q 28 T=4" in capsys.readouterr().out


def test_sigmoid_tail_gpu_harness_on_the_reference_backend(capsys):
    import sigmoid_tail_gpu as T
    T.main(["--sk", "20", "--draws", "1", "--evaluators", "poly", "--backend", "reference"])
    out = capsys.readouterr()
    assert "S_k 20 S_q 28 poly: fail 0 / 1" in out.err + out.out
