"""A refit runs without a code edit: `python -m flash_attn_poly.fit --table TMP search --target
sigmoid_attn --n 8192 --write` fits a fresh sigmoid-attention program (and its coupled _grad)
into a TEMPORARY table, and everything downstream takes it as a ProgramSpec of that table
(asm.programs.spec(name, table=...)): its blocks, the plan's score specs, attention(program=spec),
the forward and backward kernels.  Nothing here writes the committed table (a test checks).

Tiers: CPU unit (the fit, ~20 s on one core, once per module; blocks on the emulator; stages;
plan and API validation), compile (forward and backward builds for sm_90a), GPU (attention against
the torch reference at S_k = 8192, forward and backward; run on the H200).
"""
import hashlib
import math
import warnings

import numpy as np
import pytest
import torch

from flash_attn_poly.asm import blocks as B
from flash_attn_poly.asm import programs as PG

N = 8192
NAME = f"sigmoid_attn_n{N}"


def _committed_digest() -> str:
    with open(PG.default_table_path(), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


COMMITTED = _committed_digest()


@pytest.fixture(scope="module")
def refit(tmp_path_factory):
    """(table, spec) of a fresh n = 8192 fit, by the real CLI into a temporary table."""
    from flash_attn_poly.fit.__main__ import main
    path = tmp_path_factory.mktemp("refit") / "programs.json"
    main(["--table", str(path), "search", "--target", "sigmoid_attn", "--n", str(N), "--write"])
    table = PG.load_table(str(path))
    return table, PG.spec(NAME, table=table)


# ------------------------------------------------------------------------------ CPU unit
def test_fit_writes_the_temporary_table_only(refit):
    table, spec = refit
    assert sorted(table["programs"]) == [NAME, NAME + "_grad"]
    assert _committed_digest() == COMMITTED, "the refit wrote the committed table"
    assert NAME not in PG.names()
    assert (spec.n, spec.form, spec.dtype, spec.mode) == (N, "piecewise2", "bf16", "sigmoid")
    assert spec.grad is not None and spec.grad.name == NAME + "_grad"
    assert spec.roles == ("fwd", "head", "tail", "fwd_bwd")


def test_spec_hash_is_its_content(refit):
    table, spec = refit
    assert PG.spec(NAME, table=table) == spec and hash(PG.spec(NAME, table=table)) == hash(spec)
    assert PG.from_json(spec.to_json()) == spec
    other = PG.spec("sigmoid_attn_n4096")        # same form and degree, other coefficients and n
    assert other != spec and other.roles == spec.roles


@pytest.mark.parametrize("role", ["fwd", "fwd_bwd"])
def test_refit_blocks_match_the_fit_replay(refit, role):
    """The refit's blocks, built from its form alone, agree with fit.runtime's fused replay
    bit for bit on all 65,536 patterns in both lanes (the emulator runs the PTX text)."""
    import asm_reference as R
    from flash_attn_poly.asm import emulator as em
    table, spec = refit
    blk = B.block_for(spec, role)
    ref = B.block_for(PG.spec("sigmoid_attn_n4096"), role)
    assert blk.n_instructions == ref.n_instructions and blk.asm_text() != ref.asm_text()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = em.run_block(blk, *R.block_inputs(blk, "bf16"))
        exp, valid = R.expected_words(blk, table)
    for j, (g, e) in enumerate(zip(got, exp)):
        bad = np.flatnonzero((g != e) & valid)
        assert bad.size == 0, (role, j, bad[:5])


def test_plan_takes_the_refit_spec(refit):
    """plan.resolve puts the spec into the forward and backward score (their build keys), and
    the kernels' score function reads n and the dtype from it."""
    import sass_catalogue as SC
    _, spec = refit
    call = dict(SC.builds()["sigmoid_poly_d128_bf16"], program=spec, shape=(1, N, 4, 2))
    p = SC.plan_of(call)
    assert p.score.program == spec and p.score.poly_split == (1, 16)
    assert p.score != SC.plan_of(dict(call, program="sigmoid_attn_n4096")).score
    assert p.score.grad_rule == "product" and p.score_bwd.evaluator == "native"   # P on MUFU
    sur = SC.plan_of(dict(call, sigmoid_grad="surrogate"))
    assert sur.score_bwd.grad_rule == "surrogate" and sur.score_bwd.program == spec
    pytest.importorskip("cutlass")
    from flash_attn_poly.kernels import scores
    fwd, bwd = scores.device(p.score), scores.device(sur.score_bwd)
    assert (fwd.program_n, fwd.p_f16) == (N, False) and bwd.program_n == N
    # the block's input x' = x + b + ln n: exact for the default bias -ln S_k at S_k = n
    assert p.sigmoid_bias == pytest.approx(-math.log(N))
    assert fwd.fwd_scalars(p.softmax_scale, None, p.sigmoid_bias)[1] == pytest.approx(0.0, abs=1e-12)
    scores.device(SC.plan_of(dict(call, sigmoid_grad="surrogate")).score_bwd)   # it has the coupled block
    with pytest.raises(ValueError, match="BF16 inputs only"):
        fwd.check_dtype(False)


def test_attention_accepts_the_refit_spec(refit):
    """attention(program=spec) validates a spec as it validates a name (the mode's target, no
    derivative entry) and hands it to both custom ops (as its JSON under torch.compile): the
    op's call carries the spec itself."""
    import flash_attn_poly.interface as fi
    table, spec = refit
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    out = fi.attention(q, k, v, "sigmoid", program=spec, backend="reference")
    assert out.shape == q.shape
    assert fi.validate(q, k, v, "sigmoid", "poly", True, None, None, None, program=spec).program == spec
    with pytest.raises(ValueError, match="is not a softcap program"):
        fi.attention(q, k, v, "softcap", softcap=50.0, program=spec, backend="reference")
    with pytest.raises(ValueError, match="a derivative program"):
        fi.attention(q, k, v, "sigmoid", program=PG.spec(NAME + "_grad", table=table), backend="reference")
    with pytest.raises(ValueError, match="needs evaluator='poly'"):
        fi.attention(q, k, v, "sigmoid", evaluator="native", program=spec, backend="reference")
    with pytest.raises(ValueError, match="not a sigmoid program of the coefficient table"):
        fi.attention(q, k, v, "sigmoid", program=NAME, backend="reference")   # by name: committed table only
    call = fi.validate(q, k, v, "sigmoid", "poly", True, None, None, None, program=spec)
    op_args = fi._op_args(call)
    assert spec.to_json() in op_args
    assert fi._call_from_op(q, k, [], *op_args).program == spec
    torch.library.opcheck(torch.ops.flash_attn_poly.attn_fwd.default,
                          (q, k, v, [], "sigmoid", "poly", True, 0.0, -math.log(16), 0.125, [-1, -1], False,
                           spec.to_json(), "", "", "reference"))


def test_torch_compile_takes_a_spec_or_a_name(refit):
    """Under torch.compile (fullgraph) attention() takes a ProgramSpec of any table (its JSON,
    made once with the spec, is the custom ops' argument) and a name of the committed table
    (checked against the table while tracing, not traced)."""
    import flash_attn_poly.interface as fi
    _, spec = refit
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 8, 4, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    for program in (spec, "sigmoid_attn_n4096"):
        qq = q.clone().requires_grad_(True)

        def f(q, k, v):
            return fi.attention(q, k, v, "sigmoid", backend="reference", program=program).float().square().sum()

        loss = torch.compile(f, fullgraph=True, backend="eager")(qq, k, v)
        (grad,) = torch.autograd.grad(loss, qq)
        q2 = q.clone().requires_grad_(True)
        (ref,) = torch.autograd.grad(f(q2, k, v), q2)
        assert torch.equal(grad, ref)


# ------------------------------------------------------------------------------ compile
def _builds(program):
    """SASS opcode counts of the forward and backward builds attention() picks for sigmoid/poly,
    BF16, D = 128, causal, at the anchor shape, running `program` (tests/builds.py: compiled
    once per session; program=None is the catalogue's default build)."""
    import builds
    import sass_catalogue as SC
    p = SC.plan_of(dict(SC.builds()["sigmoid_poly_d128_bf16"], program=program))
    return builds.fwd(p.fwd).counts(), builds.bwd(p.bwd).counts()


@pytest.mark.compile
def test_refit_program_builds_forward_and_backward(refit):
    """The refit program's forward build: HGMMA as the default program's, its bf16x2 block on the
    packed-BF16 FMA pipe (the default FP16 program has none) with the block instructions of the
    committed program of the same form and degree (sigmoid_attn_n4096), no spills beyond the
    default program's.  The backward (product rule: P recomputed on MUFU) is the native build
    whatever the program."""
    pytest.importorskip("cutlass")
    _, spec = refit
    block_ops = ("HFMA2.BF16", "HMNMX2", "HSET2", "MUFU.TANH")
    (n, n_b), (base, base_b), (same_form, _) = _builds(spec), _builds(None), _builds("sigmoid_attn_n4096")
    assert n["HGMMA"] == base["HGMMA"] > 0, (n, base)
    assert n["HFMA2.BF16"] >= B.block_for(spec, "fwd").n_fma and base["HFMA2.BF16"] == 0, (n, base)
    assert {k: n[k] for k in block_ops} == {k: same_form[k] for k in block_ops}, (n, same_form)
    assert n["STL"] <= base["STL"] and n["LDL"] <= base["LDL"], (n, base)
    assert n_b == base_b and n_b["HFMA2.BF16"] == 0, (n_b, base_b)


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_refit_program_attention_gpu(refit):
    """attention(mode="sigmoid", program=spec) at S_k = n = 8192 (default bias -ln 8192, so the
    block's shift is exactly 0) against the torch reference that replays the same program on
    the block columns (tight: the tolerance rule) and the exact function (loose), forward and
    backward."""
    import poly_reference as pr
    import flash_attn_poly
    from flash_attn_poly.reference import attention_ref, attention_ref_backward, attention_ref_lowprec
    from flash_attn_poly.testing import assert_close_rule, plan_for, rel_l2_err
    _, spec = refit
    b, s_q, s_k, h_q, h_kv, d = 1, 1024, N, 4, 2, 128
    g = torch.Generator(device="cuda").manual_seed(8192)
    mk = lambda s, h: torch.randn(b, s, h, d, device="cuda", generator=g).to(torch.bfloat16)
    q, k, v = mk(s_q, h_q), mk(s_k, h_kv), mk(s_k, h_kv)
    fn, gfn = pr.split_fns("sigmoid", plan_for(q, k, v, "sigmoid", "poly", program=spec).score, s_k)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = flash_attn_poly.attention(qg, kg, vg, "sigmoid", program=spec)
    ref, _ = attention_ref(q, k, v, "sigmoid", score_fn=fn)
    low, _ = attention_ref_lowprec(q, k, v, "sigmoid", score_fn=fn)
    stats = assert_close_rule(out, ref, low, floor=1e-4, name=f"{NAME} out")
    exact, _ = attention_ref(q, k, v, "sigmoid")
    loose = rel_l2_err(out, exact)
    print(f"\n{NAME}: out vs same-program ref {stats['max_abs_err']:.2e} (bound {stats['bound']:.2e}); "
          f"rel L2 vs exact {loose:.2e}")
    assert loose < 0.05, "output is nowhere near the exact function"
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (qg, kg, vg), dout)
    ref_g = attention_ref_backward(dout, q, k, v, "sigmoid", score_fn=fn, score_grad_fn=gfn)
    for name, got, exp in zip(("dq", "dk", "dv"), grads, ref_g):
        assert torch.isfinite(got).all(), name
        err = rel_l2_err(got, exp)
        print(f"  {name}: rel L2 vs same-program ref {err:.2e}")
        assert err < 2e-2, f"{NAME} {name} rel L2 error {err:.3e}"
