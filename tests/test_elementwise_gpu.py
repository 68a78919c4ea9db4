"""GPU tier for kernels/elementwise.py: tails, poisoned outputs, bit-exact against the
fused-order replay of the programs, autograd, layouts.  Run on the device machine."""
import numpy as np
import pytest
import torch

from flash_attn_poly import activations as act
from flash_attn_poly.fit import runtime
from flash_attn_poly.kernels import elementwise_ops as ops
from flash_attn_poly.asm import programs
import asm_reference as reference

pytestmark = pytest.mark.gpu

SIZES = [1, 7, 8, 9, 1023, 2**20 + 3]
TORCH_DT = {"bf16": torch.bfloat16, "f16": torch.float16}


def _inputs(n, k, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(n, generator=g, device="cuda") * 4).to(TORCH_DT[dtype]) for _ in range(k)]


def _f64(t):
    return t.float().cpu().numpy().astype(np.float64)


def expected(kind, dtype, ins):
    """fit.runtime replay of the block (tests/asm_reference.py), plus g * f'(x) for (x, g) kinds."""
    vals = [_f64(t) for t in ins]
    name, table = ops.block_name(kind, dtype), programs.load_table()
    if ops.grad_mul(kind, dtype, "poly"):
        (d,) = reference.expected_values(name, table, vals[:1])
        return (runtime.mul(d, vals[1], dtype),)
    return reference.expected_values(name, table, vals)


def _run(kind, dtype, evaluator, ins, poison=True):
    n_out = ops.ARITY[kind][1]
    outs = [torch.full_like(ins[0], float("nan")) if poison else torch.empty_like(ins[0])
            for _ in range(n_out)]
    act.launch(kind, dtype, evaluator, ins, outs)
    torch.cuda.synchronize()
    return outs


POLY_KINDS = [(k, "bf16") for k in ops.BF16_KINDS] + \
    [(f"{fn}_{d}", "f16") for fn in ops.SWEEP_FNS for d in ("fwd", "bwd")]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind,dtype", POLY_KINDS)
def test_poly_bit_exact(kind, dtype, n):
    ins = _inputs(n, ops.ARITY[kind][0], dtype, seed=n)
    outs = _run(kind, dtype, "poly", ins)
    for out, ref in zip(outs, expected(kind, dtype, ins)):
        got = _f64(out)
        assert not np.isnan(got).any(), "an output element was not written"
        bad = np.flatnonzero(got != ref)
        assert bad.size == 0, f"{bad.size} mismatches, first at {bad[:5]}: {got[bad[:5]]} vs {ref[bad[:5]]}"


@pytest.mark.parametrize("kind", ["silu_fwd", "silu_bwd"])
def test_all_bf16_inputs(kind):
    bits = np.arange(1 << 16, dtype=np.uint32)
    x = runtime.from_bits(bits, "bf16")
    x = x[np.isfinite(x)]
    xt = torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).cuda()
    ins = [xt] if kind == "silu_fwd" else [xt, torch.ones_like(xt)]
    (out,) = _run(kind, "bf16", "poly", ins)
    (ref,) = expected(kind, "bf16", ins)
    assert np.array_equal(_f64(out), ref)


@pytest.mark.parametrize("n", [9, 2**20 + 3])
@pytest.mark.parametrize("kind", [k for k in ops.BF16_KINDS if not k.startswith("geglu")])
def test_native_close_to_torch(kind, n):
    ins = _inputs(n, ops.ARITY[kind][0], "bf16", seed=1)
    outs = _run(kind, "bf16", "native", ins)
    x = [t.float() for t in ins]
    s = torch.sigmoid(x[0])
    d = s * (1 + x[0] * (1 - s))
    refs = {"silu_fwd": lambda: [x[0] * s], "silu_bwd": lambda: [x[1] * d],
            "swiglu_fwd": lambda: [x[0] * s * x[1]],
            "swiglu_bwd": lambda: [x[2] * x[1] * d, x[2] * x[0] * s]}[kind]()
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out.float(), ref, rtol=2**-7, atol=2e-3)


def _geglu_native_bounds(kind, x, tanh_rel):
    """[lo, hi] per output of the native GeGLU formula when its SFU tanh is off by up to
    `tanh_rel` relative (the kernel computes the tanh form in FP32 around one tanh.approx)."""
    k, c = (2 / torch.pi) ** 0.5, 0.044715
    t = torch.tanh(k * (x[0].double() + c * x[0].double() ** 3))
    vals = []
    for f in (1 - tanh_rel, 1.0, 1 + tanh_rel):
        tt = (t * f).clamp(-1, 1)
        gelu = 0.5 * x[0] * (1 + tt)
        if kind == "geglu_fwd":
            vals.append([gelu * x[1]])
        else:
            dgelu = 0.5 * (1 + tt) + 0.5 * x[0] * (1 - tt * tt) * k * (1 + 3 * c * x[0] ** 2)
            vals.append([x[2] * x[1] * dgelu, x[2] * gelu])
    return [(torch.minimum(*[torch.minimum(v[j], w[j]) for v, w in zip(vals, vals[1:])]),
             torch.maximum(*[torch.maximum(v[j], w[j]) for v, w in zip(vals, vals[1:])]))
            for j in range(len(vals[0]))]


@pytest.mark.parametrize("n", [9, 2**20 + 3])
@pytest.mark.parametrize("kind", ["geglu_fwd", "geglu_bwd"])
def test_geglu_native_is_the_tanh_form_within_sfu_accuracy(kind, n):
    """The native GeGLU is gelu_pytorch_tanh with one tanh.approx.f32 (PTX: ~2^-11 relative
    error): each output lies in the range the formula spans when tanh is off by 2^-10, widened
    by the BF16 output rounding (2^-8 relative) and a floor for FP32 rounding.  A formula error
    (a wrong constant, term or sign) leaves that range by orders of magnitude."""
    ins = _inputs(n, ops.ARITY[kind][0], "bf16", seed=1)
    outs = _run(kind, "bf16", "native", ins)
    x = [t.double() for t in ins]
    scale = (x[1] * (x[2] if kind == "geglu_bwd" else 1)).abs().clamp_min(1) * (1 + x[0].abs() ** 3)
    for out, (lo, hi) in zip(outs, _geglu_native_bounds(kind, x, 2**-10)):
        o = out.double()
        excess = torch.maximum(lo - o, o - hi).clamp_min(0)
        tol = 2**-8 * torch.maximum(lo.abs(), hi.abs()) + 1e-6 * scale
        bad = torch.nonzero(excess > tol).flatten()
        assert bad.numel() == 0, (f"{bad.numel()} outside, first {bad[:4].tolist()}: got {o[bad[:4]].tolist()}, "
                                  f"range {lo[bad[:4]].tolist()} .. {hi[bad[:4]].tolist()}")


def test_silu_autograd_matches_replay():
    x = _inputs(4099, 1, "bf16", seed=3)[0].requires_grad_()
    g = _inputs(4099, 1, "bf16", seed=4)[0]
    y = act.silu(x)
    y.backward(g)
    assert np.array_equal(_f64(y.detach()), expected("silu_fwd", "bf16", [x.detach()])[0])
    assert np.array_equal(_f64(x.grad), expected("silu_bwd", "bf16", [x.detach(), g])[0])


@pytest.mark.parametrize("h", [1280, 12])   # 12: H % 8 != 0 -> two-tensor fallback
def test_swiglu_concat_equals_two_tensor(h):
    gu = _inputs(37 * 2 * h, 1, "bf16", seed=5)[0].view(37, 2 * h).requires_grad_()
    dy = _inputs(37 * h, 1, "bf16", seed=6)[0].view(37, h)
    y = act.swiglu(gu)
    y.backward(dy)
    gate, up = [t.detach().contiguous().requires_grad_() for t in gu.detach().chunk(2, -1)]
    y2 = act.swiglu(gate, up)
    y2.backward(dy)
    assert torch.equal(y, y2)
    assert torch.equal(gu.grad, torch.cat([gate.grad, up.grad], -1))


def test_modules_and_torch_compile():
    x = _inputs(8 * 1280, 1, "bf16", seed=7)[0].view(8, 1280)
    assert torch.equal(act.PolySiLU()(x), act.silu(x))
    f = torch.compile(lambda g, u: act.swiglu(g, u) * 2, fullgraph=True)
    g, u = _inputs(8 * 1280, 2, "bf16", seed=8)
    assert torch.equal(f(g, u), act.swiglu(g, u) * 2)


def test_misaligned_view_and_rejects():
    x = _inputs(1025, 1, "bf16", seed=9)[0]
    v = x[1:]                                  # contiguous, 2-byte offset: copied once
    assert torch.equal(act.silu(v), act.silu(v.clone()))
    with pytest.raises(ValueError, match="not contiguous"):
        act.silu(x[:1024].view(32, 32).t())


def test_geglu_autograd_matches_replay_and_compiles():
    """geglu(gate, up) forward and backward: bit-exact against the block replay (poly), the
    torch.compile'd custom op equal to the eager path, native within BF16 rounding of torch's
    gelu(approximate="tanh")."""
    gate, up = (t.view(17, 241).requires_grad_() for t in _inputs(17 * 241, 2, "bf16", seed=11))
    dy = _inputs(17 * 241, 1, "bf16", seed=12)[0].view(17, 241)
    y = act.geglu(gate, up)
    y.backward(dy)
    ins = [gate.detach(), up.detach()]
    assert np.array_equal(_f64(y.detach()), expected("geglu_fwd", "bf16", ins)[0])
    d_gate, d_up = expected("geglu_bwd", "bf16", ins + [dy])
    assert np.array_equal(_f64(gate.grad), d_gate) and np.array_equal(_f64(up.grad), d_up)
    f = torch.compile(lambda g, u: act.PolyGeGLU()(g, u) * 2, fullgraph=True)
    assert torch.equal(f(*ins), act.geglu(*ins) * 2)
    ref = torch.nn.functional.gelu(ins[0].float(), approximate="tanh") * ins[1].float()
    torch.testing.assert_close(act.geglu(*ins, "native").float(), ref, rtol=2**-7, atol=2e-3)
