"""CPU tier: bench/sweep.py without a GPU: the grid (the issue's cell count), the FLOP count, the
goal checks, the JSON / Markdown / PNG writer on synthetic rows, the driver's handling of cells
that crash, hang or do not fit the budget, the harness end to end on a tiny CPU cell (ours through
the reference backend), and the dry run."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path[:0] = [BENCH]

import sweep as S  # noqa: E402


def test_grid_is_the_issues_grid():
    """7 shapes of 16k tokens (32k at B = 1) x D 64/128/256 x causal/full x GQA/MHA x 3 modes."""
    cells = S.grid()
    assert len(cells) == 7 * 3 * 2 * 2 * 3 == 252
    assert len({c.name for c in cells}) == 252
    shapes = {(c.headdim, c.causal, c.hq, c.hkv, c.seqlen, c.batch) for c in cells}
    assert len(shapes) == 84 and {c.mode for c in cells} == {"softmax", "softcap", "sigmoid"}
    for c in cells:
        assert c.batch * c.seqlen == (32768 if c.seqlen == 32768 else 16384), c.name
        assert (c.hq, c.hkv) in ({(16, 8), (16, 16)} if c.headdim == 256 else {(32, 8), (32, 32)}), c.name
        assert S.Cell.parse(c.name) == c
    assert {c.seqlen for c in cells} == {512, 1024, 2048, 4096, 8192, 16384, 32768}
    assert [c.name for c in S.grid(**S.QUICK)] == [
        f"{m}-d128-causal-h32-8-s{s}-b{b}" for s, b in ((1024, 16), (4096, 4)) for m in S.MODES]


def test_cell_rows_time_our_softmax_beside_softcap_and_sigmoid():
    cell = S.Cell.parse("softcap-d128-causal-h32-8-s4096-b4")
    assert S.cell_rows(cell) == [("ours", "softcap"), ("fa4", "softcap"), ("flex", "softcap"), ("ours", "softmax")]
    assert S.cell_rows(S.Cell.parse("sigmoid-d64-full-h32-32-s512-b32")) == [("ours", "sigmoid"), ("ours", "softmax")]
    assert S.cell_rows(S.Cell.parse("softmax-d64-full-h32-32-s512-b32"), ("fa4", "cudnn")) == [
        ("fa4", "softmax"), ("cudnn", "softmax")]
    assert S.cell_rows(cell, ("fa4",)) == [("fa4", "softcap")]   # no reference without ours


def test_select_and_parse_errors():
    cells = S.grid()
    assert len(S.select(cells, "softmax-d128-causal-*")) == 14
    assert len(S.select(cells, "*-s32768-*, softcap-d64-full-h32-32-s512-b32")) == 36 + 1
    with pytest.raises(SystemExit, match="--cells"):
        S.select(cells, "softmax-d96-*")
    with pytest.raises(ValueError, match="cell name"):
        S.Cell.parse("softmax-d128-h32-8-s4096")


def test_flop_convention():
    """4 B Hq S^2 D forward, half of it causal, backward 2.5x: the anchor table's FA4 forward
    (B=1 S=4096 32 heads D=128 causal, 0.387 ms) is its 355 TFLOP/s."""
    shape = dict(batch=1, seqlen=4096, hq=32, hkv=8, headdim=128, causal=True)
    assert S.flops(shape, "fwd") == 4 * 32 * 4096 ** 2 * 128 / 2
    assert S.flops(shape, "bwd") == 2.5 * S.flops(shape, "fwd")
    assert S.flops(dict(shape, causal=False), "fwd") == 2 * S.flops(shape, "fwd")
    assert S.tflops(shape, "fwd", 0.387) == pytest.approx(355.1, abs=0.1)
    # B x S fixed at 16k tokens: the FLOPs of a grid row grow linearly with S
    a, b = (dict(shape, batch=16384 // s, seqlen=s) for s in (1024, 2048))
    assert S.flops(b, "fwd") == 2 * S.flops(a, "fwd")


def test_loop_sizes_follow_the_policy():
    small = dict(batch=32, seqlen=512, hq=32, hkv=8, headdim=64, causal=True)
    big = dict(batch=1, seqlen=32768, hq=32, hkv=32, headdim=128, causal=False)
    assert S.loop_sizes(small, "fwd") == (S.MAX_WARMUP, S.MAX_ITERS)
    assert S.loop_sizes(big, "bwd") == (S.MIN_WARMUP, S.MIN_ITERS)
    w, it = S.loop_sizes(dict(big, seqlen=4096, batch=4, causal=True), "fwd")
    est = S.flops(dict(big, seqlen=4096, batch=4, causal=True), "fwd") / (S.NOMINAL_TFLOPS * 1e9)
    assert S.MIN_ITERS < it < S.MAX_ITERS and it * est == pytest.approx(S.SEGMENT_MS, rel=0.1)


def _row(cell, impl, mode, direction, ms):
    c = S.Cell.parse(cell)
    return {"impl": impl, "mode": mode, "direction": direction, **c.shape, "ms": ms,
            "tflops": S.tflops(c.shape, direction, ms), "cell": cell, "reference": mode != c.mode}


SM = "softmax-d128-causal-h32-8-s8192-b2"
SC = "softcap-d128-causal-h32-8-s8192-b2"
SG = "sigmoid-d64-full-h32-32-s512-b32"


def synthetic_rows():
    """A softmax cell at S = 8k D = 128 (peak goals apply), a softcap and a sigmoid cell, with
    times chosen so that every goal has a pass and a fail."""
    shape = S.Cell.parse(SM).shape
    at = lambda tf, d: S.flops(shape, d) / tf / 1e9      # ms that gives tf TFLOP/s
    return [
        _row(SM, "ours", "softmax", "fwd", at(700.0, "fwd")),       # 70.8% peak: pass
        _row(SM, "fa4", "softmax", "fwd", at(650.0, "fwd")),
        _row(SM, "cudnn", "softmax", "fwd", at(600.0, "fwd")),      # best = fa4: 700/650 pass
        _row(SM, "ours", "softmax", "bwd", at(500.0, "bwd")),       # 50.6% < 60%: fail
        _row(SM, "fa4", "softmax", "bwd", at(520.0, "bwd")),        # 500/520 < 1: fail
        _row(SM, "cudnn", "softmax", "bwd", at(480.0, "bwd")),
        _row(SC, "ours", "softcap", "fwd", 1.0),
        _row(SC, "fa4", "softcap", "fwd", 2.0),                     # 2.0x: pass
        _row(SC, "flex", "softcap", "fwd", 3.0),
        _row(SC, "ours", "softmax", "fwd", 0.85),                   # 0.85 < 0.9: fail
        _row(SC, "ours", "softcap", "bwd", 1.0),
        _row(SC, "fa4", "softcap", "bwd", 1.5),                     # 1.5x: fail
        _row(SC, "ours", "softmax", "bwd", 0.8),                    # no goal on the softcap backward's own ratio
        _row(SG, "ours", "sigmoid", "fwd", 0.5),
        _row(SG, "ours", "softmax", "fwd", 0.5),                    # equal: pass
        _row(SG, "ours", "sigmoid", "bwd", 1.1),
        _row(SG, "ours", "softmax", "bwd", 1.0),                    # slower: fail
    ]


def test_goal_checks_on_synthetic_rows():
    res = {(r["cell"], r["direction"]): r for r in S.cell_results(synthetic_rows())}
    assert len(res) == 6
    sm_f, sm_b = res[(SM, "fwd")], res[(SM, "bwd")]
    assert sm_f["ratios"]["vs_best"] == pytest.approx(700 / 650)
    assert sm_f["goals"] == {"softmax>=best": True, "fwd>=70%peak": True}
    assert sm_b["goals"] == {"softmax>=best": False, "bwd>=60%peak": False}
    assert sm_b["ratios"]["peak"] == pytest.approx(500 / 989)
    assert res[(SC, "fwd")]["goals"] == {"softcap>=1.8xFA4": True, "softcap>=0.9xsoftmax": False}
    assert res[(SC, "fwd")]["ratios"]["vs_flex"] == 3.0
    assert res[(SC, "bwd")]["goals"] == {"softcap>=1.8xFA4": False}
    assert res[(SG, "fwd")]["goals"] == {"sigmoid>=softmax": True}
    assert res[(SG, "bwd")]["goals"] == {"sigmoid>=softmax": False}
    # a missing baseline is "not checked", never a pass
    rows = [r for r in synthetic_rows() if not (r["impl"] == "fa4" and r["mode"] == "softcap")]
    sc = {(r["cell"], r["direction"]): r for r in S.cell_results(rows)}[(SC, "fwd")]
    assert sc["goals"]["softcap>=1.8xFA4"] is None
    rows = [r for r in synthetic_rows() if r["impl"] != "cudnn"]     # the faster of one baseline, said so
    sm = {(r["cell"], r["direction"]): r for r in S.cell_results(rows)}[(SM, "fwd")]
    assert sm["best_of_one"] == "fa4" and S._verdict(sm) == "PASS (best = fa4 alone)"
    assert "best_of_one" not in res[(SM, "fwd")]
    summary = {s["goal"]: s for s in S.goal_summary(S.cell_results(synthetic_rows()))}
    assert (summary["softmax>=best"]["pass"], summary["softmax>=best"]["fail"]) == (1, 1)
    assert summary["softmax>=best"]["worst"] == pytest.approx(500 / 520)
    assert summary["softmax>=best"]["worst_cell"] == f"{SM} bwd"
    gm = summary["softmax geomean>=1.05"]
    assert gm["worst"] == pytest.approx(((700 / 650) * (500 / 520)) ** 0.5) and gm["fail"] == 1
    assert summary["softcap>=0.9xsoftmax"]["checked"] == 1    # forward only, D >= 128
    cls, need = S.softmax_classes(S.cell_results(synthetic_rows()))
    assert [(c["direction"], c["cells"]) for c in cls] == [("bwd", 1), ("fwd", 1)]
    assert need["geomean"] == pytest.approx(gm["worst"])
    assert need["parity_ceiling"] == pytest.approx((700 / 650) ** 0.5)          # the 500/520 cell at 1.0
    assert need["uniform_factor"] == pytest.approx(1.05 / gm["worst"])


def test_sigmoid_goal_scope_is_every_cell_and_softcap_own_softmax_skips_d64():
    rows = [_row("softcap-d64-causal-h32-8-s1024-b16", "ours", "softcap", "fwd", 1.0),
            _row("softcap-d64-causal-h32-8-s1024-b16", "ours", "softmax", "fwd", 0.5)]
    (r,) = S.cell_results(rows)
    assert "softcap>=0.9xsoftmax" not in r["goals"] and r["ratios"]["vs_own_softmax"] == 0.5


def _payload(rows, cells=None):
    p = S.new_payload({"rounds": 5, "order": "shuffle"}, "synthetic")
    p.update(device="NVIDIA H200 (synthetic)", torch="2.x", fa4="4.0.0b36", cudnn=91000, rows=rows)
    names = sorted({r["cell"] for r in rows})
    p["cells"] = cells if cells is not None else [{"cell": n, "status": "ok"} for n in names]
    return p


def test_report_writer_json_markdown_and_pngs(tmp_path):
    payload = _payload(synthetic_rows(), [{"cell": n, "status": "ok"} for n in (SM, SC, SG)]
                       + [{"cell": "softmax-d64-full-h32-32-s512-b32", "status": "failed (rc=-9)"}])
    path = str(tmp_path / "sweep.json")
    S.write_report(payload, path, plots=True)
    back = json.load(open(path))
    assert back == json.loads(json.dumps(payload))
    assert len(open(path).read().splitlines()) < len(payload["rows"]) + len(payload["cells"]) + 30
    for k in ("device", "date", "commit", "protocol", "rows"):
        assert k in back
    for r in back["rows"]:
        assert {"impl", "mode", "direction", "batch", "seqlen", "hq", "hkv", "headdim", "causal", "ms",
                "tflops"} <= set(r) and r["impl"] in S.ALL_IMPLS and r["direction"] in S.DIRECTIONS
    md = open(tmp_path / "sweep.md").read()
    assert "| softmax>=best |" in md and "FAIL softmax>=best, bwd>=60%peak" in md
    assert "| 128 | causal | 32/8 | 2 | 8192 | 700 | 650 | 600 | 1.08 | 1.08 | 1.17 | 71% | PASS |" in md
    assert "## softcap fwd (TFLOP/s)" in md and "## sigmoid bwd (TFLOP/s)" in md
    assert "softmax-d64-full-h32-32-s512-b32 | failed (rc=-9)" in md
    assert "4 B Hq S^2 D" in md and "989" in md
    pytest.importorskip("matplotlib")
    assert not list(tmp_path.glob("*.png"))     # figures/ beside the JSON, as bench/results/figures
    pngs = sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    assert pngs == ["sweep_sigmoid_full.png", "sweep_softcap_causal.png", "sweep_softmax_causal.png"]
    assert all((tmp_path / "figures" / p).stat().st_size < 150_000 for p in pngs)


def test_merge_later_file_wins(tmp_path):
    rows = synthetic_rows()
    a = _payload(rows)
    b = _payload([dict(r, ms=r["ms"] / 2) for r in rows if r["cell"] == SG])
    b["commit"] = "bbbbbbb"
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    m = S.merge([str(pa), str(pb)])
    assert len(m["rows"]) == len(rows) and len(m["cells"]) == 3
    sg = [r for r in m["rows"] if r["cell"] == SG and r["impl"] == "ours" and r["mode"] == "sigmoid"]
    assert sorted(r["ms"] for r in sg) == [0.25, 0.55]
    assert [x["commit"] for x in m["merged_from"]] == [a["commit"], "bbbbbbb"]
    assert m["commit"] == f"{a['commit']}, bbbbbbb" and m["selection"] == "merged"


def test_merge_keeps_a_measured_cell_that_a_later_file_lost(tmp_path):
    rows = synthetic_rows()
    a = _payload(rows)
    b = _payload([dict(r, ms=r["ms"] / 2) for r in rows if r["cell"] == SG and r["direction"] == "fwd"])
    b["cells"] = [{"cell": SG, "status": "not finished (--budget-s)"}]   # its forward, not its backward
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    m = S.merge([str(pa), str(pb)])
    assert sorted(r["ms"] for r in m["rows"]) == sorted(r["ms"] for r in rows)
    assert [c["status"] for c in m["cells"] if c["cell"] == SG] == ["ok"]
    assert {c["commit"] for c in m["cells"]} == {a["commit"]}
    assert f"Cells by the commit they were timed at: 3 at {a['commit']}." in S.markdown(m)


def _opts(**kw):
    return dict({"device": "cpu", "impls": ("ours",), "rounds": 2, "order": "shuffle", "warmup": 1,
                 "iters": 1}, **kw)


def test_driver_survives_crashing_and_hanging_cells(tmp_path, monkeypatch):
    """A cell whose process exits non-zero or hangs is recorded as failed (with its log) and the
    next cell still runs; past the budget no cell starts."""
    cmds = {"softmax-d64-causal-h2-1-s64-b1": "import sys; print('boom'); sys.exit(3)",
            "sigmoid-d64-causal-h2-1-s64-b1": "import time; time.sleep(30)"}
    monkeypatch.setattr(S, "child_command", lambda cell, opts, out: [sys.executable, "-c", cmds[cell.name]])
    cells = [S.Cell.parse(n) for n in cmds]
    p = S.run_cells(cells, _opts(cell_timeout_s=2), str(tmp_path / "s.json"))
    st = {c["cell"]: c for c in p["cells"]}
    assert st["softmax-d64-causal-h2-1-s64-b1"]["status"] == "failed (rc=3)"
    assert "boom" in st["softmax-d64-causal-h2-1-s64-b1"]["log_tail"]
    assert st["sigmoid-d64-causal-h2-1-s64-b1"]["status"] == "failed (rc=timeout)"
    assert st["sigmoid-d64-causal-h2-1-s64-b1"]["seconds"] < 20
    p = S.run_cells(cells, _opts(budget_s=1e-3), str(tmp_path / "t.json"))
    assert [c["status"] for c in p["cells"]] == ["not run (--budget-s)"] * 2
    assert "not run (--budget-s)" in open(tmp_path / "t.md").read()


DRIVER = """
import sys, os
sys.path.insert(0, {bench!r})
import sweep
child = "import os, time; open({pid!r} + '.tmp', 'w').write(str(os.getpid())); os.rename({pid!r} + '.tmp', {pid!r}); time.sleep(60)"
sweep.child_command = lambda cell, opts, out: [sys.executable, "-c", child]
sweep.run_cells([sweep.Cell.parse("softmax-d64-causal-h2-1-s64-b1")], {{"device": "cpu"}}, {out!r})
"""


def test_terminating_the_driver_ends_the_cell_process(tmp_path):
    """The cell process has a session of its own (so a cell timeout can end its whole group): a
    SIGTERM to the driver (round.sh's timeout) must end it too, not leave it on the GPU."""
    import signal
    import time
    pid_file = str(tmp_path / "child.pid")
    code = DRIVER.format(bench=BENCH, pid=pid_file, out=str(tmp_path / "s.json"))
    driver = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 60
    while not os.path.exists(pid_file) and time.time() < deadline and driver.poll() is None:
        time.sleep(0.1)
    assert os.path.exists(pid_file), "the cell process never started"
    child = int(open(pid_file).read())
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=30) == 128 + signal.SIGTERM
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the cell process outlived the driver")


def test_harness_end_to_end_on_a_tiny_cpu_cell(tmp_path):
    """The real child process (--run-cell) on the CPU: ours through the reference backend, FA4
    left out with its reason (not installed / no GPU), rows for both directions, the report."""
    cell = S.Cell.parse("softmax-d64-causal-h2-1-s64-b1")
    sig = S.Cell.parse("sigmoid-d64-full-h2-2-s64-b1")
    p = S.run_cells([cell, sig], _opts(impls=("ours", "fa4")), str(tmp_path / "sweep.json"), "cpu check")
    assert [c["status"] for c in p["cells"]] == ["ok", "ok"], p["cells"]
    got = sorted((r["cell"], r["impl"], r["mode"], r["direction"]) for r in p["rows"])
    assert got == sorted([(cell.name, "ours", "softmax", d) for d in S.DIRECTIONS]
                         + [(sig.name, "ours", m, d) for m in ("sigmoid", "softmax") for d in S.DIRECTIONS])
    assert all(r["ms"] > 0 and r["tflops"] > 0 for r in p["rows"])
    assert set(p["cells"][0]["skipped"]["fwd"]) == {"fa4/softmax"}
    assert p["cells"][0]["loops"]["bwd"] == {"warmup": 1, "iters": 1, "rounds": 2}
    assert os.path.exists(tmp_path / "sweep.md")


def test_cells_share_a_process(tmp_path, monkeypatch):
    """--cells-per-process: consecutive cells run in one child (rows and statuses as with a process
    per cell, plus the group size); in the child a cell that raises leaves the next one running
    and the exit status says so."""
    cell = S.Cell.parse("softmax-d64-causal-h2-1-s64-b1")
    sig = S.Cell.parse("sigmoid-d64-full-h2-2-s64-b1")
    assert [len(g) for g in S.groups([cell, sig, cell], 2)] == [2, 1]
    p = S.run_cells([cell, sig], _opts(impls=("ours",), per_process=2), str(tmp_path / "sweep.json"))
    assert [(c["status"], c.get("process_cells")) for c in p["cells"]] == [("ok", 2), ("ok", 2)], p["cells"]
    assert {r["cell"] for r in p["rows"]} == {cell.name, sig.name}
    assert "processes of up to 2" in p["protocol"]
    calls = []

    def fake_run_cell(c, opts, path):
        calls.append(c.name)
        if c.name == cell.name:
            raise RuntimeError("boom")
    monkeypatch.setattr(S, "run_cell", fake_run_cell)
    with pytest.raises(SystemExit) as e:
        S.run_cells_here([cell.name, sig.name], ["a.json", "b.json"], _opts())
    assert e.value.code == 1 and calls == [cell.name, sig.name]
    with pytest.raises(SystemExit, match="2 cells"):
        S.run_cells_here([cell.name, sig.name], ["a.json"], _opts())


def test_cudnn_row_falls_back_to_expanded_kv():
    """Where SDPA's cuDNN backend refuses enable_gqa (here: the CPU has no cuDNN), the row runs on
    K/V expanded to Hq heads, made outside the timed call, and says so."""
    cell = S.Cell.parse("softmax-d64-causal-h4-2-s64-b1")
    q, k, v = S._inputs(cell, "cpu", True)
    made = S._make("cudnn", "softmax", cell, q, k, v)
    assert "expanded to 4 heads" in made.note
    assert [t.shape[2] for t in made.grad_inputs] == [4, 4, 4] and all(t.requires_grad for t in made.grad_inputs)
    assert S._make("cudnn", "softmax", S.Cell.parse("softmax-d64-causal-h4-4-s64-b1"), q, q, q).note == ""


def test_dry_run_prints_cells_and_compiles_without_cuda():
    out = subprocess.run([sys.executable, os.path.join(BENCH, "sweep.py"), "--dry-run", "--quick"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # ours 10: 5 forward builds (softmax and sigmoid at S = 1k take two Q buffers, fwd-q-stages; softcap's 16 MB
    # sections at 1k are a launch argument: its 1k and 4k cells share a build), 3 backward, pre, post
    assert "6 cells (quick)" in out.stdout and "estimated kernel compiles: ours 10" in out.stdout
    assert out.stdout.count("-d128-causal-h32-8-s") == 6
    code = (f"import sys; sys.path.insert(0, {BENCH!r}); import sweep, torch; "
            "sweep.main(['--dry-run', '--cells', '*-s32768-*']); print('cuda', torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "36 cells (grid, cells *-s32768-*)" in out.stdout and out.stdout.endswith("cuda False\n")
    est = S.dry_run(S.grid())
    assert est["cells"] == 252 and est["rows"] == 84 * 2 * (3 + 4 + 2)
    # mode x D x mask, plus sigmoid's native build at S = 32k (outside the program's fitted bias
    # span at the default bias: plan.poly_outside_rule), plus the short causal D = 64 tile per mode
    # (S <= plan.SHORT_SEQLEN: the S = 512 and 1k cells), plus the packed-GQA builds of the 32/8 cells beside the
    # MHA cells' unpacked ones (plan rows fwd-pack-gqa: D = 64 softmax causal and not, D = 64 causal softcap,
    # D = 128 softcap causal and not), plus the two-Q-buffer builds of the short softmax / sigmoid cells
    # (fwd-q-stages: 12 builds, 2 of which replace the short D = 64 tile's one-buffer builds) and the
    # non-causal D = 256 softcap 64-key build at S <= 2k (fwd-d256-short-keys), plus the softcap MHA cells'
    # own builds (D = 64 two Q buffers: the short causal tile, causal 2k and non-causal; D = 128 O by TMA
    # store, causal and not: fwd-q-stages-softcap-d64, fwd-o-tma); the L2-section rows (fwd-l2-section,
    # fwd-l2-section-softcap) set the section size and CTA count, launch arguments that build nothing; each
    # warpgroup on its own key range (fwd-wg-skip) splits two builds: D = 64 non-causal softmax MHA up to 2k
    # (GQA 32/8 at S <= 1k shared it) and causal D = 256 softmax MHA at S <= 1k (the other D = 256 causal cells);
    # tiles aligned to S_q's end (fwd-q-bottom) split one: causal D = 64 sigmoid at 2k / 4k from 8k and longer;
    # and two more at S = 512, where causal softcap D = 128 keeps its tiles aligned to S_q's start (MHA, packed GQA);
    # and three where the causal D = 64 sigmoid GQA cells pack their group up to 8k keys (fwd-pack-gqa: S = 2k with
    # two Q buffers, 4k, 8k; the MHA cells keep their unpacked builds)
    assert est["ours_by_family"]["attn_fwd"] == 3 * 3 * 2 + 3 * 2 + 3 + 5 + (12 - 2) + 1 + 5 + 2 + 1 + 2 + 3
    assert est["flex_compiles"] == 2 * 84


def test_rows_carry_the_clock_their_segments_ran_at(monkeypatch):
    """On the GPU each direction's rounds run beside an nvidia-smi sampler (bench/tools/clocks.py)
    and each row gets the mean SM clock / power / event reasons of its own segments; on the CPU
    harness no clocks (a fake sampler and segments stand in for the GPU here)."""
    import types
    times, clock = S._timed_with_clocks(lambda fns, t: {"a": 1.0}, {"a": None}, None, "cpu")
    assert times == {"a": 1.0} and clock == {}
    seen = {}

    class FakeSampler:
        def __init__(self, period_ms=20, gpu=0):
            seen["period"] = period_ms

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def samples(self):
            return ["s"]

    fake = types.SimpleNamespace(Sampler=FakeSampler,
                                 per_name=lambda samples, segs: {n: {"sm_mhz": 1700.4, "power_w": 650.04,
                                                                     "reasons": "0x4"} for n, *_ in segs})
    monkeypatch.setitem(sys.modules, "clocks", fake)
    monkeypatch.setattr(S.protocol, "last_segments", lambda: [("ours/softmax", 0.0, 1.0)])
    times, clock = S._timed_with_clocks(lambda fns, t: {"ours/softmax": 2.0}, {"ours/softmax": None}, None, "cuda")
    assert times == {"ours/softmax": 2.0} and clock["ours/softmax"]["reasons"] == "0x4" and seen["period"] == 20
