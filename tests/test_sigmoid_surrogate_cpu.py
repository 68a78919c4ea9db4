"""The seed's coupled 22-instruction value/derivative block (B3) from the public API, CPU tier.

attention(q, k, v, "sigmoid", evaluator="poly", program="sigmoid_attn_n4096",
sigmoid_grad="surrogate") validates into a call whose plan carries grad_rule "surrogate" on the
score both directions share, with a program that has the "fwd_bwd" block; the backward's
sigmoid score (kernels/scores/sigmoid.py) runs that block when grad_rule is "surrogate".  The
compile tier (tests/test_attn_bwd_compile.py::test_sigmoid_poly_bwd_product_rule_is_shorter)
counts its packed FMAs in the SASS; the GPU tier runs it through attention()
(tests/test_api_gpu.py::test_sigmoid_surrogate_through_the_api)."""
import dataclasses

import pytest
import torch

import flash_attn_poly
from flash_attn_poly import testing
from flash_attn_poly.asm import blocks

PROGRAM = "sigmoid_attn_n4096"


def _qkv(s=256, d=128):   # S_k inside the program's fitted span (plan.SIGMOID_FIT_SPAN)
    g = torch.Generator().manual_seed(3)
    return [torch.randn(1, s, 2, d, generator=g).to(torch.bfloat16) for _ in range(3)]


def test_public_call_resolves_to_the_coupled_block():
    q, k, v = _qkv()
    p = testing.plan_for(q, k, v, "sigmoid", "poly", program=PROGRAM, sigmoid_grad="surrogate")
    assert p.score_bwd.grad_rule == "surrogate" and p.score == p.score_bwd
    prog = p.score_bwd.program
    assert prog.name == PROGRAM and "fwd_bwd" in prog.roles
    fwd, coupled = blocks.block_for(prog, "fwd"), blocks.block_for(prog, "fwd_bwd")
    assert (fwd.n_instructions, fwd.n_fma) == (17, 3)          # the seed's forward block
    assert (coupled.n_instructions, coupled.n_fma) == (22, 4)  # value + P (a + b x) surrogate
    # the default rule stays the product rule (plan.GRAD_ROWS), the same program in the forward,
    # P recomputed on MUFU in the backward
    d = testing.plan_for(q, k, v, "sigmoid", "poly", program=PROGRAM)
    assert d.score.grad_rule == "product" and d.score.program == prog
    assert (d.score_bwd.evaluator, d.score_bwd.program) == ("native", None)


def test_the_surrogate_kernel_score_takes_the_coupled_block():
    """The backward score object built from that plan (what the kernel traces) asks for the
    "fwd_bwd" role; the FP16 default program, which has none, is refused by the plan, naming
    sigmoid_grad and the programs that have the block (before, only the kernel build refused it,
    on the GPU); the kernel's score object keeps its own check."""
    pytest.importorskip("cutlass")
    from flash_attn_poly.kernels import scores
    q, k, v = _qkv()
    p = testing.plan_for(q, k, v, "sigmoid", "poly", program=PROGRAM, sigmoid_grad="surrogate")
    dev = scores.device(p.score_bwd)
    assert dev.grad_rule == "surrogate"
    with pytest.raises(ValueError, match=r"sigmoid_grad='surrogate' needs .*'sigmoid_attn_n4096_f16' has none.*"
                                         r"sigmoid_attn_n4096'"):
        testing.plan_for(q, k, v, "sigmoid", "poly", sigmoid_grad="surrogate")
    p16 = testing.plan_for(q, k, v, "sigmoid", "poly")
    spec16 = dataclasses.replace(p16.score, grad_rule="surrogate")
    with pytest.raises(ValueError, match="derivative surrogate needs a _grad entry"):
        scores.device(spec16)


def test_bad_sigmoid_grad_is_refused_by_name():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="sigmoid_grad must be one of"):
        flash_attn_poly.attention(q, k, v, "sigmoid", sigmoid_grad="exact", backend="reference")
    with pytest.raises(ValueError, match="sigmoid_grad selects the sigmoid poly backward"):
        flash_attn_poly.attention(q, k, v, "sigmoid", evaluator="native", sigmoid_grad="surrogate",
                                  backend="reference")


def test_reference_backend_runs_the_call():
    """The CPU dry run of the GPU test's call: forward and backward through attention()."""
    q, k, v = (t.requires_grad_(True) for t in _qkv())
    out = flash_attn_poly.attention(q, k, v, "sigmoid", evaluator="poly", program=PROGRAM,
                                    sigmoid_grad="surrogate", backend="reference")
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
