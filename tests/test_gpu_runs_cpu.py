"""CPU tier of the GPU mechanism tests that take catalogue cases (tests/gpu_check.py:
tests/test_attn_fwd_gpu.py, test_attn_bwd_gpu.py, test_api_gpu.py, test_window_gpu.py) and of
the compiled-step comparison (tests/test_compile_gpu.py): the kernel builds they compile stay
within budget, their runs resolve and dry-run on the reference backend, the compile test's
bound fails a 4x regression, and no test in tests/ carries a non-strict xfail."""
import ast
import importlib
import math
import pathlib

import pytest

torch = pytest.importorskip("torch")

import cases  # noqa: E402
import gpu_check as G  # noqa: E402

FILES = ("test_attn_fwd_gpu", "test_attn_bwd_gpu", "test_api_gpu", "test_window_gpu")
# Distinct kernel builds (forward and backward compile keys, ~10-20 s each on the GPU machine)
# of the four files when each kept its own hand-written cases, counted by enumerating their case
# tables and overrides through the plan: per file and in all (a build shared by files compiles
# once per machine: the disk cache).
BUILDS_BEFORE = {"test_attn_fwd_gpu": 63, "test_attn_bwd_gpu": 76, "test_api_gpu": 58, "test_window_gpu": 53}
BUILDS_BEFORE_UNION = 211
BUILDS_BEFORE_OUTSIDE_CATALOGUE = 157
# the budget now (the count today plus a little room for a plan that moves a case to another build;
# 106 since the L2-section rows give short MHA softmax / sigmoid cases their own section constant)
BUILDS_BUDGET_UNION = 110


def _modules():
    return {f: importlib.import_module(f) for f in FILES}


def test_the_mechanism_files_compile_fewer_builds_than_before(capsys):
    """Every run resolves its plan; the distinct builds of the four files (per file and in all)
    stay below what the hand-written cases compiled, most of them shared with the catalogue."""
    cat = cases.catalogue_builds()
    per_file, union = {}, set()
    for name, mod in _modules().items():
        b = G.builds_of(mod.RUNS)
        per_file[name] = b
        union |= b
        assert len(b) < BUILDS_BEFORE[name], (name, len(b))
        assert len({r.id for r in mod.RUNS}) == len(mod.RUNS), f"{name}: duplicate run ids"
    with capsys.disabled():
        print("\nbuilds (fwd+bwd) per file, now / before: " +
              ", ".join(f"{n} {len(b)} / {BUILDS_BEFORE[n]}" for n, b in per_file.items()) +
              f"; all {len(union)} / {BUILDS_BEFORE_UNION}, outside the catalogue's "
              f"{len(union - cat)} / {BUILDS_BEFORE_OUTSIDE_CATALOGUE}")
    assert len(union) <= BUILDS_BUDGET_UNION < BUILDS_BEFORE_UNION
    assert len(union - cat) < BUILDS_BEFORE_OUTSIDE_CATALOGUE


def test_runs_take_catalogue_cases():
    """Every run's case is a catalogue case, or one with its score or runtime values (window size,
    heads, cap) changed by cases.retarget: a catalogue (S_q, S_k) pair and layout, never a
    hand-written shape; the one exception is the sigmoid program's fitted length (S_k = 4096)."""
    cat = cases.catalogue()
    ids, pairs = {c.id for c in cat}, {(c.seqlen_q, c.seqlen_k) for c in cat}
    apimod = _modules()["test_api_gpu"]
    retargeted = 0
    for name, mod in _modules().items():
        for r in mod.RUNS:
            c = r.case
            assert c.seed == cases.stable_seed(c.id)
            if c.id in ids or r is apimod.PROGRAM_LENGTH_RUN:
                continue
            retargeted += 1
            assert (c.seqlen_q, c.seqlen_k) in pairs and c.layout in cases.LAYOUTS, (name, r.id)
    assert retargeted <= 20, retargeted


def _small_runs():
    """The smallest run of each test list of each file (cheap on the CPU)."""
    out = []
    for name, mod in _modules().items():
        lists = [v for k, v in vars(mod).items() if k.endswith("_RUNS") and isinstance(v, list) and v]
        for runs in lists:
            flat = [r for r in runs if isinstance(r, G.Run)] or [r for p in runs for r in p]
            out.append(min(flat, key=lambda r: (r.case.size, r.id)))
    return sorted(set(out), key=lambda r: r.id)


@pytest.mark.parametrize("r", G.params(_small_runs()))
def test_runs_dry_run_on_the_reference_backend(r, monkeypatch):
    """The run with the reference standing in for the kernels: plan, inputs, FP64 and torch
    references, the rule; FP32 math passes with room."""
    monkeypatch.setenv("FAP_TEST_BACKEND", "reference")
    res = G.check(r)
    assert res["checks"] and all(c["ratio"] < 1 for c in res["checks"].values())
    assert ("o" in res["checks"]) == r.fwd and ("dq" in res["checks"]) == r.bwd


def test_bad_test_backend_names_the_variable(monkeypatch):
    monkeypatch.setenv("FAP_TEST_BACKEND", "gpu")
    with pytest.raises(ValueError, match="FAP_TEST_BACKEND"):
        G.backend()


def test_pick_raises_when_too_few_cases_match():
    with pytest.raises(LookupError, match="cases.pick"):
        cases.pick(1, head_dim=96)
    c = cases.pick(1, mode="softcap", dtype="bf16")[0]
    r = cases.retarget(c, mode="sigmoid", window_size=(3, -1))
    assert r.softcap is None and r.mode == "sigmoid" and r.window_size == (3, -1) and r.id != c.id
    assert cases.retarget(r, mode="softcap").softcap == cases.SOFTCAP


# ----------------------------------------------------------------------------- the compile test's bound
def _grads(seed, n=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(64, 32, generator=g, dtype=torch.float64) for _ in range(n)]


def _off(ref, rel, seed):
    """ref plus independent noise of rel L2 size rel."""
    noise = _grads(seed, len(ref))
    scale = rel * math.sqrt(sum(r.pow(2).sum() for r in ref) / sum(x.pow(2).sum() for x in noise))
    return [r + scale * x for r, x in zip(ref, noise)]


def test_compile_bound_fails_a_4x_regression():
    import test_compile_gpu as C
    ref_g = _grads(1)
    loss = torch.tensor(4.8, dtype=torch.float64)
    eager = (loss + 1e-3, _off(ref_g, 1e-2, 2))
    assert C.compare(eager, eager, (loss, ref_g))["ok"]
    assert C.compare(eager, (loss - 1.5e-3, _off(ref_g, 1.5e-2, 3)), (loss, ref_g))["ok"]   # other rounding
    worse = [r + 4 * (e - r) for r, e in zip(ref_g, eager[1])]
    r = C.compare(eager, (eager[0], worse), (loss, ref_g))
    assert not r["ok"] and r["grad_compiled"] == pytest.approx(4 * r["grad_eager"])
    bug = _off(eager[1], 3e-2, 4)   # a gradient bug of 3% of the norm on top of the eager error
    assert not C.compare(eager, (eager[0], bug), (loss, ref_g))["ok"]
    assert not C.compare(eager, (loss + 0.05, eager[1]), (loss, ref_g))["ok"]   # the loss
    nan = [g.clone() for g in eager[1]]
    nan[0][0, 0] = math.nan
    assert not C.compare(eager, (eager[0], nan), (loss, ref_g))["ok"]


# ----------------------------------------------------------------------------- xfails
def _xfail_problems(path: pathlib.Path) -> list:
    """Every xfail in a test source that is not a pytest.mark.xfail(..., strict=True, reason=...)
    call (a bare mark, a non-strict one, or an imperative pytest.xfail())."""
    tree = ast.parse(path.read_text(), str(path))
    calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr == "xfail"):
            continue
        call = calls.get(id(node))
        where = f"{path.name}:{node.lineno}"
        if call is None:
            out.append(f"{where}: bare xfail mark (non-strict)")
            continue
        if not (isinstance(node.value, ast.Attribute) and node.value.attr == "mark"):
            out.append(f"{where}: imperative xfail()")
            continue
        kw = {k.arg: k.value for k in call.keywords}
        strict = kw.get("strict")
        if not (isinstance(strict, ast.Constant) and strict.value is True):
            out.append(f"{where}: xfail without strict=True")
        if "reason" not in kw:
            out.append(f"{where}: xfail without a reason (the documented defect)")
    return out


def test_no_non_strict_xfail_in_tests():
    here = pathlib.Path(__file__).parent
    problems = [p for f in sorted(here.rglob("*.py")) for p in _xfail_problems(f)]
    assert not problems, problems


def test_the_xfail_check_sees_non_strict_ones(tmp_path):
    src = tmp_path / "t.py"
    src.write_text("import pytest\n@pytest.mark.xfail\ndef a(): pass\n"
                   "@pytest.mark.xfail(reason='x')\ndef b(): pass\n"
                   "@pytest.mark.xfail(reason='x', strict=True)\ndef c(): pass\n"
                   "def d():\n    pytest.xfail('later')\n")
    assert len(_xfail_problems(src)) == 3
