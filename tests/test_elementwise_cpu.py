"""CPU tier for the elementwise path: input validation and the replay references."""
import numpy as np
import pytest
import torch

from flash_attn_poly import activations as act
from flash_attn_poly.fit import runtime
from flash_attn_poly.kernels import elementwise_standin as standin


def test_rejects_cpu_tensor():
    with pytest.raises(ValueError, match="CUDA"):
        act.silu(torch.zeros(8, dtype=torch.bfloat16))


def test_rejects_dtype():
    with pytest.raises(ValueError, match="float32"):
        act.silu(torch.zeros(8))
    with pytest.raises(ValueError, match="float32"):
        act.sweep_forward("tanh", torch.zeros(8))


def test_rejects_non_tensor_and_evaluator():
    with pytest.raises(TypeError, match="torch.Tensor"):
        act.silu([1.0, 2.0])
    with pytest.raises(ValueError, match="evaluator"):
        act.PolySiLU("exp")


def test_swiglu_shape_errors():
    with pytest.raises(ValueError, match="CUDA"):
        act.swiglu(torch.zeros(4, 6, dtype=torch.bfloat16))


def test_reference_silu_is_x_times_sigmoid_program():
    prog = standin.program("sigmoid_d3")
    x = runtime.all_inputs("bf16")
    x = x[np.isfinite(x)]
    (y,) = standin.reference("silu_fwd_bf16x2", [prog], x)
    assert np.array_equal(y, runtime.mul(x, runtime.replay(prog, x, "fused"), "bf16"))
    # A D3 sigmoid keeps SiLU within ~0.01*|x| + bf16 rounding of the exact function.
    exact = x / (1 + np.exp(-x))
    assert np.all(np.abs(y - exact) <= 0.012 * np.abs(x) + 2**-8 * np.abs(exact) + 1e-30)


def test_reference_swiglu_bwd_consistent_with_silu_bwd():
    prog = standin.program("sigmoid_d3")
    rng = np.random.default_rng(0)
    g, u, dy = (runtime.round_to(rng.normal(size=1000) * 3, "bf16") for _ in range(3))
    d_gate, d_up = standin.reference("swiglu_bwd_bf16x2", [prog], g, u, dy)
    (d,) = standin.reference("silu_bwd_bf16x2", [prog], g)
    (s,) = standin.reference("silu_fwd_bf16x2", [prog], g)
    assert np.array_equal(d_up, runtime.mul(dy, s, "bf16"))
    assert np.array_equal(d_gate, runtime.mul(runtime.mul(dy, u, "bf16"), d, "bf16"))
