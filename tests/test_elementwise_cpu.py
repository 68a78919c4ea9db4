"""CPU tier for the elementwise path: input validation and the replay references."""
import numpy as np
import pytest
import torch

from flash_attn_poly import activations as act
from flash_attn_poly.fit import runtime
from flash_attn_poly.kernels import elementwise_ops as ops
from flash_attn_poly.asm import programs
import asm_reference as reference


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
    """The block reference the GPU test compares against is x * p(x) of sigmoid_d3, and a
    D3 sigmoid keeps SiLU within ~0.006*|x| + bf16 rounding of the exact function."""
    table = programs.load_table()
    prog = programs.entry("sigmoid_d3", table)
    x = runtime.all_inputs("bf16")
    x = x[np.isfinite(x) & (np.abs(x) < 1e30)]
    (y,) = reference.expected_values("silu_fwd_bf16x2", table, [x])
    assert np.array_equal(y, runtime.mul(x, runtime.replay(prog, x, "fused"), "bf16"))
    exact = x / (1 + np.exp(-np.clip(x, -700, 700)))
    err = np.abs(y - exact) - 2**-8 * np.abs(exact)
    assert np.all(err <= 0.012 * np.abs(x) + 1e-30), np.max(err / np.maximum(np.abs(x), 1e-30))


def test_every_kernel_kind_has_a_block():
    for kind in ops.BF16_KINDS:
        assert ops.poly_programs(kind, "bf16")[0]["dtype"] == "bf16"
    for fn in ops.SWEEP_FNS:
        for d in ("fwd", "bwd"):
            assert ops.poly_programs(f"{fn}_{d}", "f16")[0]["dtype"] == "f16"
