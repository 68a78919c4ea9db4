"""The score functions' runtime arguments are encoded in the kernels' compiled host code from the
call's FP64 numbers (kernels/scores/*.fwd_scalars / bwd_scalars).  They must be bit for bit what
the same formulas give in Python doubles rounded once to FP32 (how they were computed before the
encoding moved into the host code): a probe kernel writes the encoded values out."""
import math
import random

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu


def _probe(score):
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Float64

    class Probe:
        @cute.jit
        def __call__(self, mOut: cute.Tensor, scale: Float64, softcap: Float64, bias: Float64, stream):
            f = [Float32(p) for p in score.fwd_scalars(scale, softcap, bias)]
            b = [Float32(p) for p in score.bwd_scalars(scale, softcap, bias)]
            self.kernel(mOut, tuple(f + b)).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

        @cute.kernel
        def kernel(self, mOut: cute.Tensor, vals):
            if cute.arch.thread_idx()[0] == 0:
                for i in cutlass.range_constexpr(len(vals)):
                    mOut[i] = vals[i]

    from cutlass.cute.runtime import make_fake_tensor
    out = make_fake_tensor(Float32, (cute.sym_int(32),), (1,), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(Probe(), out, Float64(1.0), Float64(1.0), Float64(0.0), stream, options="--enable-tvm-ffi")


SPECS = [("softmax", "native", None), ("softcap", "native", None), ("softcap", "poly", "softcap_c50_f16_odd"),
         ("softcap", "poly", "softcap_c50"), ("sigmoid", "native", None),
         ("sigmoid", "poly", "sigmoid_attn_n4096_f16")]


@pytest.mark.parametrize("kind, evaluator, program", SPECS)
def test_host_encoding_equals_python_doubles(kind, evaluator, program):
    from flash_attn_poly.asm import programs
    from flash_attn_poly.kernels import scores
    prog = None if program is None else programs.spec(program)
    spec = scores.ScoreSpec(kind=kind, evaluator=evaluator, program=prog,
                            poly_split=(1, 8) if evaluator == "poly" else (0, 1),
                            grad_rule={"softcap": "value", "sigmoid": "product"}.get(kind) if evaluator == "poly" else None)
    if program == "softcap_c50":
        spec = scores.ScoreSpec(kind=kind, evaluator=evaluator, program=prog, poly_split=(1, 8), grad_rule="block")
    dev = scores.device(spec)
    fn = _probe(dev)
    rng = random.Random(0)
    for _ in range(50):
        scale = rng.choice([64 ** -0.5, 128 ** -0.5, 256 ** -0.5, rng.uniform(1e-3, 2.0)])
        cap = rng.choice([50.0, 30.0, rng.uniform(1.0, 200.0)])
        bias = rng.choice([-math.log(4096), -math.log(rng.randint(1, 100000)), rng.uniform(-20, 20)])
        want = np.array(list(dev.fwd_scalars(scale, cap, bias)) + list(dev.bwd_scalars(scale, cap, bias)),
                        dtype=np.float64).astype(np.float32)
        out = torch.full((len(want),), float("nan"), dtype=torch.float32, device="cuda")
        fn(out, scale, cap, bias)
        got = out.cpu().numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (kind, evaluator, scale, cap, bias, got, want)
