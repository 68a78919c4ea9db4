"""CPU tier of the correctness catalogue (tests/cases.py), the fuzz draws and the rule harness
(tests/rule_harness.py): the grid covers flash-attn's, the build budget holds, shards partition
the cases by variant, the draws are reproducible, and the whole harness path (layouts, GQA,
windows, autograd, the rule, the records) runs with backend="reference" on small cases."""
import json
import math
import re

import pytest

torch = pytest.importorskip("torch")

import cases  # noqa: E402
import rule_harness as H  # noqa: E402


def test_ids_unique_and_seeds_stable():
    cat = cases.catalogue()
    ids = [c.id for c in cat]
    assert len(set(ids)) == len(ids)
    # blake2b of the id: the same in every process and Python version (hash() is salted)
    assert cases.stable_seed("softmax-native-bf16-d128-causal-b2-sq1-sk1-h4x4-contiguous") == 1811627759
    assert cat[0].seed == cases.stable_seed(cat[0].id)
    assert len({c.seed for c in cat}) == len(cat)


def test_catalogue_covers_flash_attn_grid():
    cat = cases.catalogue()
    assert {(c.mode, c.evaluator) for c in cat} == set(cases.SCORES)
    assert {c.dtype for c in cat} == {"bf16", "fp16"}
    assert {c.head_dim for c in cat} == {64, 128, 256}
    assert {c.hq // c.hkv for c in cat} >= {1, 4, 8}
    assert {c.layout for c in cat} == set(cases.LAYOUTS)
    assert {c.variant.window for c in cat} == {None, "both", "left", "right"}
    for v in cases.VARIANTS:   # decode-like rows and tails in every variant
        mine = [c for c in cat if c.variant == v]
        assert any(c.seqlen_k == 1 for c in mine) and any(c.seqlen_q == 1 for c in mine), v
        assert any(c.seqlen_q > c.seqlen_k > 1 for c in mine) and any(1 < c.seqlen_q < c.seqlen_k for c in mine), v
        assert any(c.seqlen_k % 64 for c in mine), v
    pairs = {(c.seqlen_q, c.seqlen_k) for c in cat}
    assert {(1, 1), (113, 203), (1024, 1023), (4224, 4224), (239, 1), (799, 3)} <= pairs
    # every score runs FP16 and both backward builds (MHA: head_loop; few-KV-head GQA: not)
    for m, e in cases.SCORES:
        mine = [c for c in cat if (c.mode, c.evaluator) == (m, e)]
        assert any(c.dtype == "fp16" for c in mine) and {c.hq == c.hkv for c in mine} == {True, False}


def test_every_case_resolves_and_the_build_budget_holds():
    """36 variants; the plan resolves every case (no combination it refuses); the distinct kernel
    builds (each ~10-20 s of compile on the GPU machine) stay within the budget: 42 forward and
    56 backward builds today (packed sigmoid at its default bias on the varlen kernels; the D = 64
    backward staggered from 2k keys, a second build of its variants), with room for a plan that sends some shapes of a variant to another
    build (a native fallback of a poly score at S_k = 1).  50 forward builds since the packed-GQA rows
    (fwd.pack_gqa is the group size, so the catalogue's GQA 4 and GQA 8 cases of a packing variant
    are two builds; the six shards of the catalogue ran in <= 91 s each on the H100 with them).  62 since
    the two-Q-buffer rows (fwd-q-stages: a softmax / sigmoid variant's short cases build apart from its
    long ones) and the non-causal D = 256 short-key row.  72 since the rows that split a variant by head
    layout or key length once more (softcap D = 64 / 128 MHA at <= 2k keys, 3 K / V stages at short causal
    D = 64), 80 since the L2 section rows (short MHA softmax / sigmoid: the section size is a build
    constant): 76 today."""
    assert len(cases.VARIANTS) == len(set(cases.VARIANTS)) == 36
    for c in cases.catalogue():
        cases.plan_of(c)
    b = cases.catalogue_builds()
    fwd, bwd = (sum(1 for kind, _ in b if kind == k) for k in ("fwd", "bwd"))
    assert fwd <= 80 and bwd <= 62, (fwd, bwd)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_shards_partition_by_variant(n):
    cat = cases.catalogue()
    parts = [cases.select_shard(cat, f"{i}/{n}") for i in range(n)]
    assert sorted(c.id for p in parts for c in p) == sorted(c.id for c in cat)
    owner = {}
    for i, p in enumerate(parts):
        assert p, f"shard {i}/{n} is empty"
        for c in p:
            assert owner.setdefault(c.variant, i) == i   # a variant's builds compile in one shard
    if n == 8:
        sizes = [len(p) for p in parts]
        assert max(sizes) <= 2 * min(sizes), sizes


@pytest.mark.parametrize("spec", ["3", "a/b", "2/2", "-1/4", "1/0"])
def test_bad_shard_spec_names_the_variable(spec):
    with pytest.raises(ValueError, match="FAP_SHARD"):
        cases.parse_shard(spec)


def test_fuzz_draws_are_reproducible_and_within_the_catalogue(monkeypatch):
    a, b = cases.fuzz_cases(seed=7), cases.fuzz_cases(seed=7)
    assert len(a) == cases.FUZZ_COUNT and [c.id for c in a] == [c.id for c in b]
    assert [c.id for c in cases.fuzz_cases(seed=8)] != [c.id for c in a]
    assert all(c.id.startswith(f"fuzz7_{i}-") for i, c in enumerate(a))
    allowed = cases.catalogue_builds()
    assert all(c.size <= cases.FUZZ_MAX_SIZE and cases.builds(c) <= allowed for c in a)
    assert {c.variant for c in a} <= set(cases.VARIANTS)
    assert {c.layout for c in a} == set(cases.FUZZ_LAYOUTS)
    assert any(c.seqlen_q == 1 for c in a) and any(c.seqlen_k == 1 for c in a)
    assert {c.hq // c.hkv for c in a} == {1, 2, 4, 8}
    caps = {c.softcap for c in a if c.mode == "softcap"}
    assert min(caps) >= 5 and max(caps) <= 50 and len(caps) > 5
    monkeypatch.setenv("FAP_FUZZ_SEED", "123")
    assert cases.fuzz_seed() == 123
    monkeypatch.setenv("FAP_FUZZ_SEED", "x")
    with pytest.raises(ValueError, match="FAP_FUZZ_SEED"):
        cases.fuzz_seed()


def test_layouts_are_the_strided_views_they_name():
    v = cases.Variant("softmax", "native", "bf16", 64, True, None)
    mk = lambda layout, s_q=5, s_k=5: H.make_inputs(cases.Case(v, 2, s_q, s_k, 4, 2, layout=layout), "cpu")
    q, k, v_, do = mk("packed_qkv")
    assert q.data_ptr() + 4 * 64 * 2 == k.data_ptr() and q.stride()[:2] == (5 * 8 * 64, 8 * 64)
    q, k, v_, _ = mk("packed_qkv", 3, 5)     # S_q != S_k: k and v share one projection
    assert q.is_contiguous() and k.stride(1) == 4 * 64 and k.data_ptr() + 2 * 64 * 2 == v_.data_ptr()
    q, k, v_, _ = mk("transposed")
    assert not q.is_contiguous() and q.stride()[1:] == (64, 5 * 64, 1)
    q, k, v_, _ = mk("padded3")
    assert q.stride(2) == 67 and q.stride(-1) == 1
    assert all(t.dtype == torch.bfloat16 for t in (q, k, v_, do))
    torch.testing.assert_close(mk("contiguous")[0], mk("contiguous")[0])   # seeded


@pytest.mark.parametrize("mode", ["softmax", "softcap", "sigmoid"])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (3, 2)), (True, (4, -1))])
def test_lowprec_backward_is_the_exact_backward_without_rounding(mode, causal, window):
    """In FP32 (no rounding of P or dS) lowprec_backward is the FP64 explicit backward: the
    formulas (masks, GQA fold, softcap and sigmoid derivatives, D from O) are right."""
    from flash_attn_poly import reference as R
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, s, h, 16, generator=g) for s, h in ((7, 4), (9, 2), (9, 2)))
    if mode == "softcap":
        q = q * 8
    do = torch.randn(2, 7, 4, 16, generator=g)
    kw = dict(causal=causal, window_size=window, softcap=30.0 if mode == "softcap" else None)
    out, _ = R.attention_ref(q, k, v, mode, **kw)
    got = H.lowprec_backward(do, q, k, v, out.float(), mode, **kw)
    ref = R.attention_ref_backward(do, q, k, v, mode, **kw)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


def _small_cases():
    """A dozen small catalogue cases, one per (layout, MHA or GQA, mode): the CPU dry run."""
    seen, out = set(), []
    for c in sorted(cases.catalogue(), key=lambda c: (c.size, c.id)):
        key = (c.layout, c.hq == c.hkv, c.mode)
        if c.size <= 64 * 1024 and key not in seen and 1 < c.seqlen_k:
            seen.add(key)
            out.append(c)
    return out[:12]


@pytest.mark.parametrize("case", _small_cases(), ids=lambda c: c.id)
def test_harness_runs_catalogue_cases_on_the_reference_backend(case, tmp_path, monkeypatch):
    """backend="reference" as "ours": layouts, GQA, windows, autograd, the rule and the JSON
    record all run; FP32 math passes the rule with room to spare."""
    monkeypatch.setenv("FAP_CORRECTNESS_OUT", str(tmp_path))
    monkeypatch.setenv("FAP_SHARD", "1/3")
    rec = H.check(case, "reference", H.recorder_for("catalogue"))
    names = ["o", "dq", "dk", "dv"] + ([] if case.mode == "sigmoid" else ["lse"])
    assert sorted(rec["checks"]) == sorted(names)
    assert rec["status"] == "passed"
    assert all(0 <= c["ratio"] < 1 and c["torch_err"] > 0 for n, c in rec["checks"].items() if n != "lse")
    (line,) = (tmp_path / "catalogue-shard1of3.jsonl").read_text().splitlines()
    assert json.loads(line)["id"] == case.id


@pytest.mark.parametrize("case", [c for c in cases.catalogue() if c.size <= 4096 and c.seqlen_k == 1][:4],
                         ids=lambda c: c.id)
def test_harness_single_key_cases_on_the_reference_backend(case):
    """S_k = 1: O = V exactly (softmax modes), torch's error is 0: the floor alone decides."""
    rec = H.check(case, "reference")
    assert rec["status"] == "passed"


def _small_fuzz_cases():
    """The smallest fuzz draw of each layout (padded strides and GQA packing included)."""
    seen, out = set(), []
    for c in sorted(cases.fuzz_cases(), key=lambda c: (c.size, c.id)):
        if c.layout not in seen and c.hq != c.hkv and c.seqlen_k > 1:
            seen.add(c.layout)
            out.append(c)
    return out


@pytest.mark.parametrize("case", _small_fuzz_cases(), ids=lambda c: c.id)
def test_harness_runs_fuzz_cases_on_the_reference_backend(case):
    assert H.check(case, "reference")["status"] == "passed"


def test_rule_catches_a_4x_regression_nan_and_lse_pattern():
    v = cases.Variant("softmax", "native", "bf16", 64, True, None)
    case = cases.Case(v, 1, 200, 300, 4, 1)
    q, k, v_, do = (t.detach() for t in H.make_inputs(case, "cpu"))
    from flash_attn_poly import reference as R
    ref, ref_lse = R.attention_ref(q, k, v_, "softmax", causal=True)
    low, low_lse = R.attention_ref_lowprec(q, k, v_, "softmax", causal=True)
    dt = torch.bfloat16
    assert H.judge("o", low, ref, low, dt)["ok"]
    worse = (ref + 4 * (low.double() - ref)).to(dt)
    assert not H.judge("o", worse, ref, low, dt)["ok"]
    nan = low.clone()
    nan[0, 0, 0, 0] = math.nan
    assert "non-finite" in H.judge("o", nan, ref, low, dt)["why"]
    lse = low_lse.clone()
    lse[0, 0, 0] = -math.inf
    assert "finite in one" in H.judge("lse", lse, ref_lse, low_lse, dt)["why"]
    # S_q > S_k causal: the first rows see no key: LSE -inf there on both sides
    case = cases.Case(v, 1, 9, 4, 2, 2)
    q, k, v_, _ = (t.detach() for t in H.make_inputs(case, "cpu"))
    ref, ref_lse = R.attention_ref(q, k, v_, "softmax", causal=True)
    low, low_lse = R.attention_ref_lowprec(q, k, v_, "softmax", causal=True)
    assert (~torch.isfinite(ref_lse)).any() and H.judge("lse", low_lse, ref_lse, low_lse, dt)["ok"]


@pytest.mark.parametrize("mode", ["softmax", "softcap"])
def test_the_dterm_floor_keeps_a_4x_gradient_regression_failing(mode):
    """The D-term floor (DTERM_SIGMAS) must not let a 4x error through at ordinary sizes: torch's own gradients
    pass judge_case, gradients 4x as far from the FP64 reference fail for dQ, dK and dV; the D term's share of the
    bound stays below torch's share (at 1 to 5 keys it can exceed it: docs/MEASURED.md, rule-dterm)."""
    from flash_attn_poly import reference as R
    v = cases.Variant(mode, "native", "bf16", 64, True, None)
    case = cases.Case(v, 1, 200, 300, 4, 1, softcap=30.0 if mode == "softcap" else None)
    q, k, v_, do = (t.detach() for t in H.make_inputs(case, "cpu"))
    kw = case.kwargs()
    with torch.no_grad():
        ref = R.attention_ref_backward(do, q, k, v_, mode, **kw)
        low_o, _ = R.attention_ref_lowprec(q, k, v_, mode, **kw)
        low = H.lowprec_backward(do, q, k, v_, low_o, mode, **kw)
    ok = H.judge_case(case, q, k, v_, do, None, None, low, directions=("bwd",))
    assert all(c["ok"] for c in ok.values()), ok
    worse = [(r + 4 * (lo.double() - r)).to(lo.dtype) for r, lo in zip(ref, low)]
    bad = H.judge_case(case, q, k, v_, do, None, None, worse, directions=("bwd",))
    assert not any(c["ok"] for c in bad.values()), bad
    for name in ("dq", "dk"):
        c = ok[name]
        assert c["floor"] < H.FACTOR * c["torch_err"], (name, c)


# ----------------------------------------------------------------------------- bench/correctness.py
def _bench_correctness():
    import os
    import sys
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import correctness
    return correctness


def _rec(tier, id_, mode, ev, status=None, **ratios):
    checks = {d: {"err": r * 1e-3, "torch_err": 5e-4, "floor": 1e-5, "ratio": r, "ok": r <= 1,
                  "why": "" if r <= 1 else f"{d} too big"} for d, r in ratios.items()}
    status = status or ("passed" if all(r <= 1 for r in ratios.values()) else "failed")
    return {"tier": tier, "id": id_, "mode": mode, "evaluator": ev, "status": status, "device": "NVIDIA H200",
            "checks": checks}


def test_collector_merges_shards_and_names_the_worst_case(tmp_path):
    C = _bench_correctness()
    lines = {
        "catalogue-shard0of2.jsonl": [
            _rec("catalogue", "a", "softmax", "native", o=0.5, lse=0.1, dq=0.7, dk=0.6, dv=0.4),
            _rec("catalogue", "b", "softcap", "poly", "failed", o=1.8, lse=0.2, dq=0.9, dk=0.3, dv=0.2),
            _rec("catalogue", "b", "softcap", "poly", o=0.9, lse=0.2, dq=0.9, dk=0.3, dv=0.2)],   # a rerun
        "catalogue-shard1of2.jsonl": [
            _rec("catalogue", "c", "sigmoid", "poly", "failed", o=0.3, dq=1.4, dk=0.2, dv=0.2),
            {"tier": "catalogue", "id": "d", "mode": "sigmoid", "evaluator": "native", "status": "error",
             "message": "RuntimeError: boom", "device": "NVIDIA H200"}],
        "fuzz-shard0of1.jsonl": [_rec("fuzz", "fuzz42_0-x", "softmax", "native", o=0.2, lse=0.0, dq=1.2, dk=0.1, dv=0.1),
                                 _rec("fuzz", "fuzz42_1-y", "softmax", "native", o=0.3, lse=0.0, dq=0.1, dk=0.1, dv=0.1)],
    }
    for name, recs in lines.items():
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    out = tmp_path / "res" / "correctness.json"
    payload = C.collect(str(tmp_path), str(out), commit="abc1234", date="2026-12-01")
    assert payload["tiers"]["catalogue"] == {"run": 4, "passed": 2, "failed": 1, "errors": 1}
    assert payload["tiers"]["fuzz"] == {"run": 2, "passed": 1, "failed": 1, "errors": 0}
    assert payload["max_ratio"]["softcap/poly"]["o"]["ratio"] == 0.9     # the rerun replaced the failure
    assert payload["max_ratio"]["softmax/native"]["dq"] == pytest.approx(
        {"ratio": 1.2, "id": "fuzz42_0-x", "tier": "fuzz", "err": 1.2e-3, "torch_err": 5e-4, "floor": 1e-5})
    assert payload["worst"] == {"ratio": 1.4, "direction": "dq", "id": "c", "tier": "catalogue"}
    assert [f["id"] for f in payload["failures"]] == ["c", "d", "fuzz42_0-x"]
    assert payload["fuzz_seeds"] == [42]
    assert "boom" in payload["failures"][1]["why"]
    on_disk = json.loads(out.read_text())
    assert on_disk["device"] == "NVIDIA H200" and on_disk["commit"] == "abc1234"
    md = (tmp_path / "res" / "correctness.md").read_text()
    assert "| catalogue | 4 | 2 | 1 | 1 |" in md and "| sigmoid/poly | 0.300 | — | 1.400 |" in md
    assert "Worst case: `c` (catalogue), dQ ratio 1.400" in md and "Fuzz seed: 42" in md
    assert C.main(["collect", str(tmp_path), "--json", str(out)]) == 1   # failures: non-zero exit


def test_collector_tells_known_defects_from_new_failures(tmp_path):
    """A failure recorded with known_defect (a KNOWN_DEFECTS case: tests/rule_harness.case_fields) is
    marked known and alone does not fail the collection; a known defect that passed does."""
    C = _bench_correctness()
    known = dict(_rec("fuzz", "fuzz7_1-k", "softcap", "poly", dk=1.05), known_defect="why")
    (tmp_path / "fuzz-shard0of1.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [known, _rec("fuzz", "fuzz7_2-ok", "softmax", "native", dq=0.5)]) + "\n")
    out = tmp_path / "correctness.json"
    payload = C.collect(str(tmp_path), str(out))
    assert [(f["id"], f["known"]) for f in payload["failures"]] == [("fuzz7_1-k", True)]
    assert "(known defect)" in (tmp_path / "correctness.md").read_text()
    assert C.main(["collect", str(tmp_path), "--json", str(out)]) == 0
    (tmp_path / "catalogue-shard0of1.jsonl").write_text(json.dumps(_rec("catalogue", "n", "softmax", "native", o=1.5)) + "\n")
    assert C.main(["collect", str(tmp_path), "--json", str(out)]) == 1          # a new failure
    (tmp_path / "catalogue-shard0of1.jsonl").unlink()
    fixed = dict(_rec("fuzz", "fuzz7_1-k", "softcap", "poly", dk=0.9), known_defect="why")
    (tmp_path / "fuzz-shard0of1.jsonl").write_text(json.dumps(fixed) + "\n")
    assert C.collect(str(tmp_path), str(out))["known_passed"] == ["fuzz7_1-k"]
    assert C.main(["collect", str(tmp_path), "--json", str(out)]) == 1          # its entry is to go


def test_harness_marks_known_defects():
    kid = next(i for i in cases.KNOWN_DEFECTS if i.startswith("fuzz"))
    seed = int(re.match(r"fuzz(\d+)_", kid).group(1))
    draws = cases.fuzz_cases(seed=seed)
    case = next(c for c in draws if c.id == kid)
    assert H.case_fields(case, "reference")["known_defect"] == cases.KNOWN_DEFECTS[kid]
    other = next(c for c in draws if c.id not in cases.KNOWN_DEFECTS)
    assert "known_defect" not in H.case_fields(other, "reference")


def test_collector_refuses_empty_dirs_and_bad_lines(tmp_path):
    C = _bench_correctness()
    with pytest.raises(FileNotFoundError, match="FAP_CORRECTNESS_OUT"):
        C.read_records(str(tmp_path))
    (tmp_path / "fuzz-shard0of1.jsonl").write_text('{"tier": "fuzz"}\nnot json\n')
    with pytest.raises(ValueError, match=r"fuzz-shard0of1.jsonl:2"):
        C.read_records(str(tmp_path))


def test_collector_reads_what_the_harness_writes(tmp_path, monkeypatch):
    """Records of the reference backend (one a raised case) through the real recorder, collected."""
    C = _bench_correctness()
    monkeypatch.setenv("FAP_CORRECTNESS_OUT", str(tmp_path))
    monkeypatch.delenv("FAP_SHARD", raising=False)
    rec = H.recorder_for("fuzz")
    case = _small_fuzz_cases()[0]
    H.check(case, "reference", rec)
    bad = cases.Case(cases.VARIANTS[0], 1, 4, 4, 3, 2, tier="fuzz")   # 3 query heads over 2 KV heads: refused
    with pytest.raises(ValueError, match="multiple"):
        H.check(bad, "reference", rec)
    payload = C.collect(str(tmp_path), str(tmp_path / "r.json"), commit="x", date="d")
    assert payload["tiers"]["fuzz"] == {"run": 2, "passed": 1, "failed": 0, "errors": 1}
    assert payload["device"] == "cpu" and payload["worst"]["id"] == case.id


# ----------------------------------------------------------------------------- bench/tools/sanitize.py
def _sanitize():
    import os
    import sys
    tools = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import sanitize
    return sanitize


def test_sanitize_verdicts():
    """Each tool's own summary decides: memcheck/synccheck an ERROR SUMMARY, racecheck a RACECHECK
    SUMMARY of hazards (it prints no ERROR SUMMARY: a clean racecheck run is clean, not failed)."""
    S = _sanitize()
    run = lambda **kw: {"unsupported": None, "rc": 0, "errors": None, "hazards": None, **kw}
    assert S.verdict(run(errors=0)) == "clean"
    assert S.verdict(run(hazards=(0, 0))) == "clean"
    assert S.verdict(run(hazards=(0, 3))) == "clean"          # warnings alone do not fail
    assert S.verdict(run(hazards=(2, 0))) == "errors" and S.verdict(run(errors=1)) == "errors"
    assert S.verdict(run()) == "failed" and S.verdict(run(rc="timeout", hazards=(0, 0))) == "failed"


def test_sanitize_calls_run_catalogue_builds():
    """Every call of the sanitizer driver (5 scores x 4 shapes) resolves to builds the correctness
    catalogue compiles, so under the tools the kernels load from the disk cache."""
    S = _sanitize()
    specs = S.call_specs()
    assert len(specs) == 20 and len({n for n, *_ in specs}) == 20
    allowed = cases.catalogue_builds()
    for name, mode, ev, p in specs:
        assert cases.builds(S.as_case(mode, ev, p)) <= allowed, name
    assert {p["d"] for *_, p in specs} == {64, 128, 256} and any(p["s_q"] % 64 and p["s_k"] % 64 for *_, p in specs)


def test_sanitize_packed_calls_run_on_the_reference(capsys):
    """The opt-in packed shape: attention_varlen at D = 256 over sequences with an empty and a
    one-token one, each score (sigmoid with one bias for all sequences, so the packed kernels run);
    the driver's dry run on the CPU reference gives finite outputs and gradients."""
    S = _sanitize()
    specs = S.call_specs(shapes=("packed",))
    assert len(specs) == 5 and all(p["d"] == 256 and 0 in p["lens"] and 1 in p["lens"] for *_, p in specs)
    assert S.run_calls(specs, backend="reference") == 0
    assert capsys.readouterr().out.count(" ok ") == 5


def test_sanitize_gqapack_calls_take_the_packed_gqa_forward():
    """The opt-in gqapack shape (D = 64, 8 / 2 heads, causal S = 1100: past the short rows) resolves to the
    packed-GQA forward for every score (plan rows fwd-pack-gqa; sigmoid's up to PACK_GQA_MAX_KEYS keys)."""
    from flash_attn_poly import plan as P
    S = _sanitize()
    specs = S.call_specs(shapes=("gqapack",))
    assert len(specs) == 5
    for name, mode, ev, p in specs:
        call = P.AttnCall(mode=mode, evaluator=ev, dtype=p["dtype"], head_dim=p["d"], batch=p["b"],
                          seqlen_q=p["s_q"], seqlen_k=p["s_k"], heads_q=p["hq"], heads_kv=p["hkv"],
                          causal=p["causal"], window=(-1, -1), softmax_scale=p["d"] ** -0.5,
                          softcap=50.0 if mode == "softcap" else None)
        assert p["causal"] and P.resolve(call, 132).fwd.pack_gqa == 4, name


@pytest.mark.parametrize("argv,match", [(["--tools", "memcheck,nope"], "--tools"),
                                        (["--shapes", "tail,huge"], "--shapes"),
                                        (["--scores", "softmax/poly"], "--scores")])
def test_sanitize_arguments_name_the_bad_value(argv, match, capsys):
    S = _sanitize()
    with pytest.raises((SystemExit, ValueError), match=None) as e:
        S.main(argv + ["--no-warm"])
    text = str(e.value) + capsys.readouterr().err
    assert match in text


def test_sanitize_parses_reports_and_decides():
    S = _sanitize()
    clean = "========= COMPUTE-SANITIZER\nsoftmax ok\n========= ERROR SUMMARY: 0 errors\n"
    r = S.parse_report(clean)
    assert r["errors"] == 0 and r["unsupported"] is None
    race = ("========= Error: Race reported between Write access at 0x1f0 in AttnFwdSm90\n"
            "========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\n"
            "========= ERROR SUMMARY: 1 error\n")
    r = S.parse_report(race)
    assert r["hazards"] == (1, 2) and r["errors"] == 1 and "Race reported" in r["first"][0]
    base = {"tool": "racecheck", "seconds": 1.0, "log": "x"}
    assert S.verdict({**base, "rc": S.ERROR_EXIT, **r}) == "errors"
    warn_only = S.parse_report("========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)\n"
                               "========= ERROR SUMMARY: 0 errors\n")
    assert S.verdict({**base, "rc": 0, **warn_only}) == "clean"
    assert S.verdict({**base, "rc": 0, **S.parse_report("========= Error: Device not supported\n")}) == "unavailable"
    assert S.verdict({**base, "rc": "timeout", **S.parse_report("partial")}) == "failed"


def _fake_sanitizer(tmp_path, body):
    exe = tmp_path / "bin" / "compute-sanitizer"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return str(exe.parent)


@pytest.mark.parametrize("body,rc,word", [
    ('echo "========= ERROR SUMMARY: 0 errors"; exit 0\n', 0, "clean"),
    ('echo "========= Invalid __global__ read of size 4 bytes"; echo "========= ERROR SUMMARY: 2 errors"; exit 86\n',
     1, "errors"),
    ('echo "========= Error: Device not supported"; exit 1\n', 3, "unavailable")])
def test_sanitize_driver_end_to_end_with_a_stand_in_tool(tmp_path, monkeypatch, body, rc, word):
    """The driver's parent side (tool runs, logs, summary, exit status) with a stand-in
    compute-sanitizer on PATH (the calls themselves need a GPU)."""
    import os
    S = _sanitize()
    monkeypatch.setenv("PATH", _fake_sanitizer(tmp_path, body) + os.pathsep + os.environ["PATH"])
    out = tmp_path / "out"
    monkeypatch.setenv("OUT", str(out))      # the device tool's folder is the default
    assert S.main(["--no-warm"]) == rc
    text = (out / "sanitize_summary.txt").read_text()
    assert [ln.split(":")[0] for ln in text.splitlines() if not ln.startswith(" ")][1:] == list(S.TOOLS)
    assert f"memcheck: {word}" in text
    assert sorted(p.name for p in out.iterdir()) == ["sanitize.log", "sanitize_summary.txt"]
    assert "==== racecheck" in (out / "sanitize.log").read_text()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert S.main(["--no-warm", "--tools", "synccheck", "--out", str(tmp_path / "o2")]) == S.UNAVAILABLE_EXIT
    assert "not on PATH" in (tmp_path / "o2" / "sanitize_summary.txt").read_text()


def test_sanitize_stops_when_the_calls_fail_without_a_tool(tmp_path, monkeypatch):
    """A failing warm-up (the calls raise with no sanitizer: here, no GPU) runs no tool and fails."""
    import os
    S = _sanitize()
    monkeypatch.setenv("PATH", _fake_sanitizer(tmp_path, "exit 0\n") + os.pathsep + os.environ["PATH"])
    monkeypatch.setattr(S, "_child_cmd", lambda args: [os.environ.get("PYTHON", "python3"), "-c", "raise SystemExit(5)"])
    assert S.main(["--out", str(tmp_path / "o")]) == 1
    text = (tmp_path / "o" / "sanitize_summary.txt").read_text()
    assert text.startswith("warm-up (no sanitizer): rc=5") and "memcheck" not in text


def test_sanitize_calls_dry_run_on_the_reference_backend(capsys):
    S = _sanitize()
    assert S.main(["--calls", "--backend", "reference", "--shapes", "tail,d256",
                   "--scores", "softcap/poly,sigmoid/native"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[:2] for ln in lines] == [["tail:softcap/poly", "ok"], ["tail:sigmoid/native", "ok"],
                                                ["d256:softcap/poly", "ok"], ["d256:sigmoid/native", "ok"]]


# ----------------------------------------------------------------------------- calibration
def _emulation_cases():
    """The largest catalogue cases the CPU affords, one per score x dtype x window x S_k = 1."""
    picked, seen = [], set()
    for c in sorted(cases.catalogue(), key=lambda c: (-c.size, c.id)):
        key = (c.mode, c.dtype, c.variant.window is not None, c.seqlen_k == 1)
        if c.size <= 600_000 and key not in seen:
            seen.add(key)
            picked.append(c)
    return picked


def test_a_flash_attention_order_emulation_passes_the_rule_with_room():
    """tests/fa_emulation.py (online softmax over 64-key blocks, unrounded row sum, P and dS
    rounded to the input dtype, D from the output) is what a right kernel computes: the rule
    passes it on every score, dtype, window and S_k = 1, with the largest ratio well below 1
    (a rule this kernel order could fail would fail right kernels on the GPU)."""
    import fa_emulation as E
    worst = {}
    for case in _emulation_cases():
        q, k, v, do = (t.detach() for t in H.make_inputs(case, "cpu"))
        kw = case.kwargs()
        out, lse = E.forward(q, k, v, case.mode, **kw)
        grads = E.backward(do, q, k, v, out, lse, case.mode, **kw)
        checks = H.judge_case(case, q, k, v, do, out, lse, grads)
        for n, c in checks.items():
            assert c["ok"], (case.id, n, c)
            worst[n] = max(worst.get(n, 0.0), c["ratio"])
    assert len(_emulation_cases()) >= 10
    assert max(worst.values()) < 0.9, worst


def test_the_dscore_factor_in_fp16_passes_the_rule_with_room():
    """The backward's 128-row step keeps the dS factor of softcap (P (1 - t^2)) and sigmoid
    (p (1 - p)) as FP16 pairs (attn_bwd_sm90 f_packed).  Emulated on the same cases: with BF16
    inputs the gradients' ratios to the rule's bound do not move (FP16's 11 bits are below dS's
    BF16 rounding); with FP16 inputs the factor's rounding is as large as dS's own and the worst
    ratio grows (measured 0.43 -> 0.71, sigmoid dK) but stays inside the rule with room."""
    import fa_emulation as E
    picked = [c for c in _emulation_cases() if c.mode in ("softcap", "sigmoid")]
    assert sum(c.dtype == "bf16" for c in picked) >= 4 and sum(c.dtype == "fp16" for c in picked) >= 2
    for case in picked:
        q, k, v, do = (t.detach() for t in H.make_inputs(case, "cpu"))
        kw = case.kwargs()
        out, lse = E.forward(q, k, v, case.mode, **kw)
        ratio = {}
        for f16 in (False, True):
            checks = H.judge_case(case, q, k, v, do, out, lse,
                                  E.backward(do, q, k, v, out, lse, case.mode, f16_factor=f16, **kw))
            for n in ("dq", "dk", "dv"):
                assert checks[n]["ok"], (case.id, f16, n, checks[n])
                ratio[f16, n] = checks[n]["ratio"]
        for n in ("dq", "dk"):
            if case.dtype == "bf16":
                assert ratio[True, n] <= ratio[False, n] + 0.02, (case.id, n, ratio)
            assert ratio[True, n] < 0.8, (case.id, n, ratio)


@pytest.mark.parametrize("rounded_row_sum", [False, True], ids=["fp32_row_sum", "rounded_row_sum"])
def test_the_catalogue_catches_softcaps_constant_max_normalisation(rounded_row_sum):
    """Issue 26's softcap defect, emulated: with the constant row max c - 20, a row's largest p
    is not 1, so its BF16 rounding for the PV product no longer cancels against an FP32 row sum
    and O = V at S_k = 1 comes back off by an ulp: the rule fails the catalogue's S_k = 1 cases.
    Normalising by the sum of the rounded P passes them."""
    import fa_emulation as E
    picked = [c for c in cases.catalogue() if c.mode == "softcap" and c.dtype == "bf16" and c.seqlen_k == 1
              and c.size < 4096]
    assert picked
    verdicts = []
    for case in picked:
        q, k, v, do = (t.detach() for t in H.make_inputs(case, "cpu"))
        kw = case.kwargs()
        out, lse = E.forward(q, k, v, "softcap", fixed_max=case.softcap - 20.0,
                             rounded_row_sum=rounded_row_sum, **kw)
        verdicts.append(H.judge_case(case, q, k, v, do, out, lse, [torch.zeros_like(t) for t in (q, k, v)])["o"]["ok"])
    assert all(verdicts) if rounded_row_sum else not any(verdicts), verdicts


def test_pinned_fuzz_draws_stay_in_the_default_list():
    """FUZZ_PINNED (a defect's draw the default seed no longer makes itself) ends the default fuzz
    list, with the id (and so the inputs) it was drawn with, on the catalogue's builds; other seeds
    draw only."""
    import cases
    default = cases.fuzz_cases()
    ids = [c.id for c in default]
    for c in cases.FUZZ_PINNED:
        assert ids.count(c.id) == 1 and c.tag.startswith(f"fuzz{cases.FUZZ_SEED}_")
        assert cases.builds(c) <= cases.catalogue_builds(), c.id
    assert len(default) == cases.FUZZ_COUNT + sum(c.id not in ids[:cases.FUZZ_COUNT] for c in cases.FUZZ_PINNED)
    assert not {c.id for c in cases.FUZZ_PINNED} & {c.id for c in cases.fuzz_cases(seed=7)}


def test_fuzz_case_names_a_draw_or_a_pinned_one():
    import cases
    assert cases.fuzz_case("pinned:0") is cases.FUZZ_PINNED[0]
    assert cases.fuzz_case("7:3").id == cases.fuzz_cases(seed=7)[3].id
    for bad in ("7", "pinned:9", "a:b", "7:-1", "pinned"):
        with pytest.raises(ValueError, match="SEED:INDEX or pinned:N"):
            cases.fuzz_case(bad)


def test_known_defects_name_existing_cases():
    """Every strict xfail of the GPU tiers names a case the catalogue or the default fuzz draw
    holds (a stale entry would silently stop guarding anything)."""
    import cases
    ids = {c.id for c in cases.catalogue()} | {c.id for c in cases.fuzz_cases()}
    assert set(cases.KNOWN_DEFECTS) <= ids, sorted(set(cases.KNOWN_DEFECTS) - ids)


def test_the_rule_passes_a_flash_attention_order_kernel_at_tiny_key_counts():
    """The GPU fuzz tier at 182922b failed two softcap poly D = 256 draws with 5 and 9 keys (dK / dQ 1.04-1.26x the
    bound).  A FlashAttention-order kernel (tests/fa_emulation.py: online max, FP32 row sum, P and dS rounded, D from
    the rounded O) missed the rule as often there: ~4% of softcap draws with S_q <= 3, S_k <= 12 (up to 3.8x the
    bound on dQ / dK; softmax ~0.3%).  With so few terms each gradient's max error is one realisation of the D
    term's rounding, and 2x torch's is a coin toss against another; the floor now holds DTERM_SIGMAS standard
    deviations of that term (tests/rule_harness.py _dterm_sigmas), and this kernel passes (worst 0.70-0.90 of the
    bound over 300 draws each of softcap D = 128 / 256 and softmax D = 256, measured on the CPU)."""
    import numpy as np
    import fa_emulation as E
    rng = np.random.default_rng(11)
    v = cases.Variant("softcap", "poly", "bf16", 128, True, None)
    missed = []
    for i in range(120):
        s_q = int(rng.integers(1, 4))
        s_k = int(rng.integers(s_q, 13))
        hkv = int(rng.choice([1, 2]))
        hq = hkv * int(rng.choice([1, 2, 4]))
        cap = float(rng.integers(10, 101)) / 2
        case = cases.Case(v, int(rng.integers(1, 4)), s_q, s_k, hq, hkv, (-1, -1), "contiguous", cap,
                          tier="fuzz", tag=f"tiny{i}")
        q, k, vv, do = (t.detach() for t in H.make_inputs(case, "cpu"))
        kw = case.kwargs()
        out, lse = E.forward(q, k, vv, "softcap", **kw)
        checks = H.judge_case(case, q, k, vv, do, out, lse, E.backward(do, q, k, vv, out, lse, "softcap", **kw))
        missed += [(case.id, n, round(c["ratio"], 2)) for n, c in checks.items() if not c["ok"]]
    assert not missed, missed
