"""CPU tier: the host-side rules the benchmarks and the backward's defaults depend on."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))


def test_head_loop_auto_rule(monkeypatch):
    """head_loop_auto: MHA always; GQA when the KV-head grid has >= 1.5 CTAs per SM (132 SMs:
    the anchor shape's 256 CTAs qualify, S = 1024's 64 do not; D = 256 counts 2 chunks)."""
    pytest.importorskip("cutlass")
    from flash_attn_poly.kernels import attn_bwd_sm90 as K
    monkeypatch.setattr(K, "_sm_count", lambda device: 132)
    t128, t256 = K.BwdTile.for_head_dim(128), K.BwdTile.for_head_dim(256)
    assert K.head_loop_auto(1, 32, 32, 1024, t128, 128, None)            # MHA: same grid
    assert K.head_loop_auto(1, 32, 8, 4096, t128, 128, None)             # 32 x 8 = 256 >= 198
    assert not K.head_loop_auto(1, 32, 8, 1024, t128, 128, None)         # 8 x 8 = 64
    assert not K.head_loop_auto(1, 32, 8, 3072, t128, 128, None)         # 24 x 8 = 192 < 198
    assert K.head_loop_auto(1, 8, 4, 8192, t256, 256, None)              # 64 x 4 x 2 chunks
    assert K.head_loop_auto(4, 32, 8, 1024, t128, 128, None)             # batch 4: 256


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


def test_poly_split_configs_are_valid_stages():
    """bench/poly_split.py's configs build as stages (program in the table, split legal)."""
    pytest.importorskip("cutlass")
    import poly_split
    from flash_attn_poly.kernels import score_stages as S
    from flash_attn_poly.kernels import attn_fwd_sm90 as A
    for mode, prog, split, *tuning in poly_split.CONFIGS:
        st = S.make_stage(mode, "poly", program=prog, poly_split=split) if prog else S.make_stage(mode, "native")
        if prog:
            assert st.program.name == prog and st.poly_split == split
        for text in tuning:   # the forward tuning, as attn_fwd builds the config
            tun = poly_split._tuning(text)
            for k in poly_split.BWD_KNOBS:   # a backward keyword: a valid side
                if k in tun:
                    from flash_attn_poly.kernels.score_stages_bwd import bwd_side
                    bwd_side(mode, "poly", split, program=prog, **{k: tun.pop(k)})
            kw = dict(tun, **A._fixed_max_kw(mode, "bf16", 50.0, tun))
            A.AttnFwdSm90(A._config_for_stage(st, "bf16", 128, True, tuple(sorted(kw.items()))))


@pytest.mark.parametrize("phase,count", [("tail8", 7), ("grad", 5), ("next12", 3)])
def test_prepared_poly_split_selection_names_configs(phase, count):
    """A device phase's `poly_split.py --only` names are configs of bench/poly_split.py."""
    import re
    import poly_split
    text = open(os.path.join(os.path.dirname(__file__), "..", "bench", "h200_round.sh")).read()
    body = text.split(f'"$phase" = {phase} ]', 1)[1].split("\nelif ", 1)[0]
    only = re.search(r'--only "([^"]*)"', body.replace("\\\n", "")).group(1).split(",")
    names = {poly_split._name(*c) for c in poly_split.CONFIGS}
    assert len(only) == count and set(only) <= names, set(only) - names


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


def _round_fwd_knobs(phase: str) -> list:
    """The --knob values of bench/fwd_tuning.py in one bench/h200_round.sh phase."""
    import re
    text = open(os.path.join(os.path.dirname(__file__), "..", "bench", "h200_round.sh")).read()
    body = text.split(f'"$phase" = {phase} ]', 1)[1].split("\nelif ", 1)[0]
    return re.findall(r"--knob (\S+)", body)


@pytest.mark.parametrize("phase", ["acc", "lazy", "tail8", "fence29", "pp31", "tn32", "tn33", "ho37", "wg38", "sp40", "tl43", "e2f45", "e2f49"])
def test_prepared_forward_knob_runs_build_valid_configs(phase):
    """Every knob a prepared device phase times (and bench/fwd_knob_accuracy.py's settings)
    makes a config the forward accepts for the modes it runs with, as attn_fwd would build it
    (softcap 50, BF16): a bad knob fails here, not on the device."""
    pytest.importorskip("cutlass")
    import fwd_knob_accuracy
    import fwd_tuning
    from flash_attn_poly.kernels import attn_fwd_sm90 as A, score_stages as S

    def build(mode, ev, tuning):
        tuning = dict(tuning)
        # split=J/K popped; else attn_fwd's default stage for the knob's key block
        stage = fwd_tuning._stage(mode, ev, tuning) or S.make_stage(mode, ev, key_block=tuning.get("tile_n", 128))
        kw = dict(tuning, **A._fixed_max_kw(mode, "bf16", 50.0, tuning))
        A.AttnFwdSm90(A.AttnFwdConfig.default(stage, "bf16", 128, True, **kw))
    knobs = _round_fwd_knobs(phase)
    assert knobs, f"no --knob in phase {phase}"
    modes = {"acc": [("softcap", "native"), ("softcap", "poly")], "lazy": [("softmax", "native")],
             "tail8": [("softmax", "native")],
             "sp40": [("softcap", "poly"), ("softcap", "native"), ("softmax", "native")],
             "tl43": [("softcap", "poly"), ("softcap", "native")],
             "e2f45": [("softcap", "poly"), ("softcap", "native")],
             "e2f49": [("softcap", "native"), ("softcap", "poly")],
             "wg38": [("softcap", "native"), ("softcap", "poly"), ("softmax", "native"), ("sigmoid", "poly")],
             "ho37": [("softcap", "native"), ("softcap", "poly"), ("softmax", "native"), ("sigmoid", "native"),
                      ("sigmoid", "poly")],
             "tn33": [("softcap", "native"), ("softcap", "poly")],
             "tn32": [("softcap", "native"), ("softcap", "poly"), ("softmax", "native")],
             "pp31": [("softcap", "native"), ("softcap", "poly"), ("softmax", "native"), ("sigmoid", "native"),
                      ("sigmoid", "poly")],
             "fence29": [("softcap", "native"), ("softcap", "poly"), ("sigmoid", "native"), ("sigmoid", "poly")]}[phase]
    for knob in knobs:
        for mode, ev in modes:
            if ev == "poly" or not set(fwd_tuning.STAGE_KNOBS) & set(fwd_tuning._knob(knob)):   # skipped rows
                build(mode, ev, fwd_tuning._knob(knob))
    for mode, settings in fwd_knob_accuracy.SETTINGS.items():
        for _, tuning in settings:
            build(mode, "native", tuning)


def test_ncu_summary_reads_the_committed_round(tmp_path):
    """bench/ncu_summary.py on the committed Nsight Compute round: every build has its pipe
    shares and loop stall split (shares of the loop summing to 1), and the finding the notes
    rest on is in the data: softcap keeps the tensor pipe less busy than softmax and the MUFU
    pipe busier."""
    import ncu_summary

    folder = os.path.join(os.path.dirname(__file__), "..", "bench", "results", "logs", "round_ncu28_fc43451")
    out = tmp_path / "ncu.json"
    assert ncu_summary.main([folder, "--json", str(out)]) == 0
    rows = {r["build"]: r for r in json.load(open(out))["rows"]}
    assert set(rows) == set(ncu_summary.BUILDS)
    for r in rows.values():
        shares = [v for k, v in r.items() if k.startswith("loop: ") and k != "loop: loop_share_of_samples"]
        assert abs(sum(shares) - 1.0) < 1e-9 and 0 < r["loop: loop_share_of_samples"] < 1
    assert rows["softcap_native"]["tensor_pct"] < rows["softmax"]["tensor_pct"] - 10
    assert rows["softcap_native"]["mufu_pct"] > rows["softmax"]["mufu_pct"] + 10
    assert (tmp_path / "ncu.md").read_text().count("| softcap_poly |") == 2
