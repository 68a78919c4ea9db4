"""CPU tier for the elementwise path: input validation and the replay references."""
import warnings

import numpy as np
import pytest
import torch

from flash_attn_poly import activations as act
from flash_attn_poly.fit import runtime
from flash_attn_poly.kernels import elementwise_ops as ops
from flash_attn_poly.asm import programs
import asm_reference as reference


def _bf16(*shape, seed=0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 4).to(torch.bfloat16)


def test_cuda_backend_rejects_cpu_tensor():
    x = _bf16(8)
    with pytest.raises(ValueError, match=r"silu\(backend='cuda'\): x is on cpu.*CUDA"):
        act.silu(x, backend="cuda")
    with pytest.raises(ValueError, match=r"gate is on cpu"):
        act.swiglu(x, x, backend="cuda")
    with pytest.raises(ValueError, match=r"gate_up is on cpu"):
        act.swiglu(_bf16(4, 16), backend="cuda")
    with pytest.raises(ValueError, match="x is on cpu"):
        act.sweep_forward("tanh", x.half())          # the FP16 sweeps have no reference path


def test_rejects_dtype():
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        act.silu(torch.zeros(8, dtype=torch.float64))
    with pytest.raises(TypeError, match="x has dtype torch.int32"):
        act.silu(torch.zeros(8, dtype=torch.int32), backend="reference")
    with pytest.raises(TypeError, match="x has dtype torch.float32"):
        act.sweep_forward("tanh", torch.zeros(8))


def test_rejects_non_tensor_and_evaluator():
    with pytest.raises(TypeError, match="torch.Tensor"):
        act.silu([1.0, 2.0])
    with pytest.raises(ValueError, match="evaluator"):
        act.PolySiLU("exp")
    with pytest.raises(ValueError, match="backend must be"):
        act.PolySwiGLU(backend="tpu")


# every bad input on a CPU tensor reports itself, not "is on cpu" (the device decides the
# backend only once the inputs are valid); (call, exception, message)
_BAD_INPUTS = {
    "silu-evaluator": (lambda: act.silu(_bf16(8), "exp"), ValueError, "evaluator must be"),
    "silu-backend": (lambda: act.silu(_bf16(8), backend="gpu"), ValueError, "backend must be"),
    "silu-dtype": (lambda: act.silu(_bf16(8).double()), TypeError, "x has dtype torch.float64"),
    "silu-not-tensor": (lambda: act.silu(3.0), TypeError, "x must be a torch.Tensor"),
    "swiglu-evaluator": (lambda: act.swiglu(_bf16(8), _bf16(8), "exp"), ValueError, "evaluator must be"),
    "swiglu-dtype": (lambda: act.swiglu(_bf16(8), _bf16(8).long()), TypeError, "up has dtype torch.int64"),
    "swiglu-mixed-dtypes": (lambda: act.swiglu(_bf16(8), _bf16(8).half()), TypeError,
                            "gate and up must share one dtype"),
    "swiglu-shapes": (lambda: act.swiglu(_bf16(4, 8), _bf16(4, 6)), ValueError,
                      r"gate \(4, 8\) and up \(4, 6\) differ in shape"),
    "swiglu-odd-gate-up": (lambda: act.swiglu(_bf16(4, 7)), ValueError, "gate_up must have an even last"),
    "swiglu-0d-gate-up": (lambda: act.swiglu(_bf16(1)[0]), ValueError, "gate_up must have an even last"),
    "swiglu-gate-up-dtype": (lambda: act.swiglu(_bf16(4, 8).double()), TypeError, "gate_up has dtype"),
    "module-evaluator": (lambda: act.PolySwiGLU("fast"), ValueError, "evaluator must be"),
}


@pytest.mark.parametrize("case", list(_BAD_INPUTS))
def test_bad_inputs_on_cpu_report_themselves(case):
    call, err, match = _BAD_INPUTS[case]
    with pytest.raises(err, match=match) as e:
        call()
    assert e.type is err and "is on cpu" not in str(e.value)


def test_auto_runs_the_reference_on_cpu_with_a_warning():
    """backend="auto" on CPU tensors: the torch reference, with a warning naming why; the same
    result as backend="reference", which is silent."""
    x = _bf16(8, 16)
    with pytest.warns(UserWarning, match=r"flash_attn_poly.silu: x is on cpu.*torch reference"):
        y = act.silu(x)
    with pytest.warns(UserWarning, match=r"flash_attn_poly.swiglu: gate_up is on cpu"):
        z = act.swiglu(x)
    with pytest.warns(UserWarning, match=r"flash_attn_poly.swiglu: gate is on cpu"):
        act.PolySwiGLU()(x, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(y, act.silu(x, backend="reference"))
        assert torch.equal(y, act.PolySiLU(backend="reference")(x))
        assert torch.equal(z, act.swiglu(x, backend="reference"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reference_backend_values_and_gradients(dtype):
    """silu / swiglu(gate, up) / swiglu(gate_up) on the reference backend: the exact function
    within the dtype's rounding, any layout (a transposed view too), gradients within the dtype's
    rounding of the FP64 derivative (silu' = s (1 + x (1 - s)))."""
    g64 = torch.randn(6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 4
    u64 = torch.randn(6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    s = torch.sigmoid(g64)
    eps = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-21}[dtype]   # FP32: a few ulps of math
    close = lambda got, want: (got.double() - want).abs().max() <= 2 * eps * want.abs().max()
    x = g64.to(dtype).requires_grad_()
    y = act.silu(x.t(), "native", backend="reference")      # non-contiguous: fine for torch
    assert y.dtype == dtype and close(y.t(), g64 * s)
    y.t().double().backward(u64)
    xd = x.detach().double()
    sd = torch.sigmoid(xd)
    assert close(x.grad, u64 * sd * (1 + xd * (1 - sd)))
    gate, up = g64.to(dtype).requires_grad_(), u64.to(dtype).requires_grad_()
    out = act.swiglu(gate, up, backend="reference")
    assert close(out, g64 * s * u64)
    out.double().sum().backward()
    gu = torch.cat([gate.detach(), up.detach()], -1).requires_grad_()
    out2 = act.swiglu(gu, backend="reference")
    assert close(out2, out.double())      # (FP32: torch's strided and contiguous sigmoid may differ by an ulp)
    out2.double().sum().backward()
    assert close(gu.grad, torch.cat([gate.grad, up.grad], -1).double())
    gd, ud = gate.detach().double(), up.detach().double()
    sg = torch.sigmoid(gd)
    assert close(gate.grad, ud * sg * (1 + gd * (1 - sg))) and close(up.grad, gd * sg)


def test_pick_backend_decision():
    """The decision on a CUDA device, stood in by its capability: BF16 on sm_90 runs the
    kernels; another dtype or GPU falls back under "auto" with a warning naming it and is
    refused by "cuda" with the same reason; "reference" never asks."""
    x = _bf16(8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert act._pick_backend("silu", "auto", "x", x, (9, 0)) == "cuda"
        assert act._pick_backend("silu", "cuda", "x", x, (9, 0)) == "cuda"
        assert act._pick_backend("silu", "reference", "x", x, None) == "reference"
    for t, cap, err, match in ((x.half(), (9, 0), TypeError, "x has dtype torch.float16"),
                               (x.float(), (9, 0), TypeError, "x has dtype torch.float32"),
                               (x, (8, 0), RuntimeError, "this GPU is sm_80"),
                               (x, (10, 0), RuntimeError, "this GPU is sm_100")):
        with pytest.warns(UserWarning, match=match):
            assert act._pick_backend("silu", "auto", "x", t, cap) == "reference"
        with pytest.raises(err, match=match):
            act._pick_backend("silu", "cuda", "x", t, cap)


def test_reference_traces_under_torch_compile():
    x = _bf16(4, 16)
    f = torch.compile(lambda t: act.swiglu(t, backend="reference") * 2, fullgraph=True, backend="eager")
    assert torch.equal(f(x), act.swiglu(x, backend="reference") * 2)


def test_reference_silu_is_x_times_sigmoid_program():
    """The block reference the GPU test compares against is x * p(x) of sigmoid_d3 inside the
    program's clamp and exactly 0 / x beyond it (|x| > L_c), and its backward rule
    p + x p (1 - p) is exactly 0 / 1 there.  Over every finite BF16 input the value and the
    gradient are within 0.045 of the exact SiLU and SiLU' (measured 0.039 and 0.035, at
    |x| = 5.4): an absolute bound.  The program's own value beyond the clamp (p = 2^-8 and
    1 - 2^-8) gave errors growing as |x| / 256 (64 and 39 at |x| < 1e4), and a 4,000-step B1
    training run with it diverged at step ~2,800 (bench/results/loss_parity_4k.md)."""
    table = programs.load_table()
    prog = programs.entry("sigmoid_d3", table)
    x = runtime.all_inputs("bf16")
    x = x[np.isfinite(x)]
    (y,) = reference.expected_values("silu_fwd_bf16x2", table, [x])
    (g,) = reference.expected_values("silu_bwd_bf16x2", table, [x])
    inside = np.abs(x) <= prog["L_c"]
    p = runtime.replay(prog, x[inside], "fused")
    assert np.array_equal(y[inside], runtime.mul(x[inside], p, "bf16"))
    assert np.array_equal(y[~inside], np.where(x[~inside] > 0, x[~inside], 0.0))
    assert np.array_equal(g[~inside], (x[~inside] > 0).astype(np.float64))
    with np.errstate(over="ignore"):
        sig = 1 / (1 + np.exp(-np.clip(x, -700, 700)))
    assert np.max(np.abs(y - x * sig)) <= 0.045
    assert np.max(np.abs(g - sig * (1 + x * (1 - sig)))) <= 0.045


def test_every_kernel_kind_has_a_block():
    for kind in ops.BF16_KINDS:
        assert ops.poly_programs(kind, "bf16")[0]["dtype"] == "bf16"
    for fn in ops.SWEEP_FNS:
        for d in ("fwd", "bwd"):
            assert ops.poly_programs(f"{fn}_{d}", "f16")[0]["dtype"] == "f16"


# ---- GeGLU (Gemma-2's gelu_pytorch_tanh MLP) ---------------------------------------------

def _gelu_tanh(x):
    k = np.sqrt(2 / np.pi)
    t = np.tanh(k * (x + 0.044715 * x**3))
    return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)


def test_geglu_blocks_are_gelu_programs_within_their_error_of_the_tanh_form():
    """The block reference the GPU test compares against is gelu_d4(gate) * up (forward) and
    (dy*up)*gelu_d4_grad(gate), dy*gelu_d4(gate) (backward); the erf-fitted programs stay within
    their own fitted error (+ 1e-3 for erf vs tanh) of gelu_pytorch_tanh at every BF16 input,
    and beyond the clamp they are exact (max(x, 0)) / saturate near 0 and 1."""
    table = programs.load_table()
    x = runtime.all_inputs("bf16")
    x = x[np.isfinite(x) & (np.abs(x) < 1e4)]
    val = runtime.replay(programs.entry("gelu_d4", table), x, "fused")
    der = runtime.replay(programs.entry("gelu_d4_grad", table), x, "fused")
    ones = np.ones_like(x)
    (y,) = reference.expected_values("geglu_fwd_bf16x2", table, [x, ones])
    assert np.array_equal(y, val)
    d_gate, d_up = reference.expected_values("geglu_bwd_bf16x2", table, [x, ones, ones])
    assert np.array_equal(d_gate, der) and np.array_equal(d_up, val)
    exact, dexact = _gelu_tanh(x)
    fit_val = programs.entry("gelu_d4", table)["errors"]["bf16_fused"]
    fit_der = programs.entry("gelu_d4_grad", table)["errors"]["bf16_fused"]
    assert np.abs(val - exact).max() <= fit_val + 1e-3
    assert np.abs(der - dexact).max() <= fit_der + 1e-3
    big = np.abs(x) > 4
    assert np.array_equal(val[big], np.maximum(x[big], 0))
    assert np.abs(der[big] - (x[big] > 0)).max() < 0.05


def test_geglu_validation_and_reference():
    with pytest.raises(ValueError, match=r"gate \(4, 8\) and up \(4, 6\) differ in shape"):
        act.geglu(_bf16(4, 8), _bf16(4, 6))
    with pytest.raises(TypeError, match="up has dtype torch.int64"):
        act.geglu(_bf16(8), _bf16(8).long())
    with pytest.raises(ValueError, match="evaluator must be"):
        act.PolyGeGLU("fast")
    with pytest.raises(ValueError, match=r"geglu\(backend='cuda'\): gate is on cpu"):
        act.geglu(_bf16(8), _bf16(8), backend="cuda")
    with pytest.warns(UserWarning, match=r"flash_attn_poly.geglu: gate is on cpu"):
        act.geglu(_bf16(8), _bf16(8))
    g64 = torch.randn(6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 4
    u64 = torch.randn(6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    gate, up = g64.to(torch.bfloat16).requires_grad_(), u64.to(torch.bfloat16).requires_grad_()
    out = act.PolyGeGLU(backend="reference")(gate, up)
    val, der = (torch.from_numpy(t) for t in _gelu_tanh(gate.detach().double().numpy()))
    want = val * up.detach().double()
    assert out.dtype == torch.bfloat16
    assert (out.double() - want).abs().max() <= 2 * 2**-8 * want.abs().max()
    out.double().sum().backward()
    assert (gate.grad.double() - der * up.detach().double()).abs().max() <= 2 * 2**-8 * (der * up.detach().double()).abs().max()
    assert (up.grad.double() - val).abs().max() <= 2 * 2**-8 * val.abs().max()
    f = torch.compile(lambda a, b: act.geglu(a, b, backend="reference") * 2, fullgraph=True, backend="eager")
    assert torch.equal(f(gate.detach(), up.detach()), act.geglu(gate.detach(), up.detach(), backend="reference") * 2)


def test_geglu_custom_ops_trace_forward_and_backward_with_fake_tensors():
    """What torch.compile sees of geglu on the GPU, traced on the CPU without running a kernel:
    the forward custom op's fake, its registered autograd calling the backward op (whose fake
    gives both gradients), no graph break."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(gate, up, dy):
        y = act._geglu_fwd(gate, up, "poly")
        return (y,) + torch.autograd.grad(y, (gate, up), dy)

    gate, up = (_bf16(4, 24, seed=s).requires_grad_() for s in (1, 2))
    gm = make_fx(step, tracing_mode="fake")(gate, up, _bf16(4, 24, seed=3))
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert ops.count("flash_attn_poly.geglu_fwd.default") == 1, ops
    assert ops.count("flash_attn_poly.geglu_bwd.default") == 1, ops


_EXACT = {"silu": torch.nn.functional.silu,
          "swiglu": lambda gate, up: torch.nn.functional.silu(gate) * up,
          "geglu": lambda gate, up: torch.nn.functional.gelu(gate, approximate="tanh") * up}


def _recording_kernels(calls):
    """Stands in for activations._launch_fast on the CPU: records (kind, evaluator, number of
    inputs, number of outputs, layout) and writes the exact function's value (kind *_fwd) or
    its vector-Jacobian product with the last input (kind *_bwd), computed in FP64."""
    def run(kind, dtype, evaluator, ins, outs, layout="flat", h=0):
        calls.append((kind, evaluator, len(ins), len(outs), layout))
        fn = _EXACT[kind.rsplit("_", 1)[0]]
        xs = [t.double() for t in ins]
        if kind.endswith("_fwd"):
            outs[0].copy_(fn(*xs))
        else:
            for out, d in zip(outs, torch.func.vjp(fn, *xs[:-1])[1](xs[-1])):
                out.copy_(d)
    return run


@pytest.mark.parametrize("name", ["silu", "swiglu", "geglu", "swiglu_concat_h6"])
def test_eager_kernel_path_launches_and_differentiates(monkeypatch, name):
    """The eager fast path on the CPU with the kernel launch recorded (the CUDA part is the only
    thing left out): which kinds run with how many tensors, that the forward returns the
    kernel's output and autograd returns the backward kernel's outputs per input."""
    calls = []
    monkeypatch.setattr(act, "_launch_fast", _recording_kernels(calls))
    monkeypatch.setattr(act, "_which", lambda fn, backend, arg, t: "cuda")
    kind = name.split("_")[0]
    if name == "swiglu_concat_h6":      # H = 6: halves not 16-byte aligned, two-tensor kernel
        gate_up = _bf16(4, 12, seed=1).requires_grad_()
        ins, call_ins = [gate_up], list(gate_up.detach().chunk(2, dim=-1))
        y = act.swiglu(gate_up, evaluator="native")
    else:
        ins = [_bf16(4, 16, seed=s).requires_grad_() for s in range(1 if kind == "silu" else 2)]
        call_ins = [t.detach() for t in ins]
        y = getattr(act, kind)(*ins, evaluator="native")
    dy = _bf16(*y.shape, seed=9)
    grads = torch.autograd.grad(y, ins, dy)
    n = len(call_ins)
    assert calls == [(f"{kind}_fwd", "native", n, 1, "flat"),
                     (f"{kind}_bwd", "native", n + 1, n, "flat")]
    xs = [t.double() for t in call_ins]
    assert torch.equal(y, _EXACT[kind](*xs).to(torch.bfloat16))
    want = [d.to(torch.bfloat16) for d in torch.func.vjp(_EXACT[kind], *xs)[1](dy.double())]
    if len(ins) < n:                    # the gradient of gate_up is [d_gate | d_up]
        want = [torch.cat(want, dim=-1)]
    assert len(grads) == len(want) and all(torch.equal(g, w) for g, w in zip(grads, want))
    calls.clear()
    with torch.no_grad():
        getattr(act, kind)(*[t.detach() for t in ins], evaluator="poly")
    assert calls == [(f"{kind}_fwd", "poly", n, 1, "flat")]
