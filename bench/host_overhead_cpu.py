"""CPU-only host cost of the elementwise torch wrappers, kernel launch stubbed.

What it times: the Python path of silu()/swiglu() forward, and fwd+bwd through autograd,
up to (and including) the call into the compiled kernel, which is replaced by a no-op.
CPU tensors stand in for CUDA ones: the device-type test in _check is bypassed (the
rest of the validation runs as written).  Numbers are for comparing versions of
flash_attn_poly/activations.py on one machine, not GPU wall times.

    python bench/host_overhead_cpu.py
"""
from __future__ import annotations

import timeit

import torch

from flash_attn_poly import activations as act


def _noop(*args):
    return None


def _patch():
    orig_check = act._check

    def check(name, t, dtypes=(torch.bfloat16,)):
        # _check as written, minus the device-type test (CPU stand-ins)
        if not isinstance(t, torch.Tensor) or t.dtype not in dtypes or not t.is_contiguous() \
                or t.numel() > act._MAX_NUMEL:
            return orig_check(name, t, dtypes)
        t.device.type  # the attribute read the real check does
    act._check = check
    act._compiled = lambda key: _noop
    act._sm_count = lambda i: 132
    if hasattr(act, "_DEVICE_TYPES"):
        act._DEVICE_TYPES = ("cuda", "cpu")   # fast path: accept CPU stand-ins
        act._check = orig_check


def main():
    _patch()
    n = 4096
    x = torch.randn(n).to(torch.bfloat16)
    g = torch.randn(n).to(torch.bfloat16).requires_grad_()
    u = torch.randn(n).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(n).to(torch.bfloat16)

    def step():
        g.grad = u.grad = None
        act.swiglu(g, u).backward(dy)

    def torch_step():
        g.grad = u.grad = None
        (torch.nn.functional.silu(g) * u).backward(dy)

    xh = torch.randn(n).to(torch.float16)
    gh = torch.randn(n).to(torch.float16)
    cases = {"silu fwd (no grad)": lambda: act.silu(x),
             "sweep gelu fwd (FP16)": lambda: act.sweep_forward("gelu", xh),
             "sweep gelu bwd (FP16)": lambda: act.sweep_backward("gelu", xh, gh),
             "swiglu fwd (no grad)": lambda: act.swiglu(g.detach(), u.detach()),
             "swiglu fwd+bwd (autograd)": step,
             "torch eager silu(g)*u fwd+bwd, tiny CPU tensors (reference)": torch_step}
    for name, fn in cases.items():
        for _ in range(200):
            fn()
        best = min(timeit.repeat(fn, number=2000, repeat=5)) / 2000
        print(f"{name:62s} {best * 1e6:7.2f} us/call")


if __name__ == "__main__":
    main()
