"""A tiny CuTe DSL kernel that maps arrays of packed words through one PTX block, so the
GPU result can be compared with the emulator bit for bit (tests/test_asm_gpu.py).  Test
support (it compiles through kernels/sass.py, which asm may not import).

One thread per element.  Packed (b32) operands travel as int32 tensors, f32 operands as
float32 tensors; every block has at most 3 inputs and 2 outputs, so the kernel always takes
three input and two output tensors and ignores the unused ones (the block is a compile-time
constant, so the unused loads are never emitted).

``compile_selftest(block, n)`` builds for sm_90a with fake tensors (CPU-only is fine);
``run_selftest(block, inputs)`` compiles, runs on the current CUDA device and returns
numpy uint32 outputs.
"""
from __future__ import annotations

import numpy as np

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from flash_attn_poly.asm import cute_ops
from flash_attn_poly.asm.blocks import PtxBlock
from flash_attn_poly.kernels import sass

THREADS = 256


@cute.kernel
def _map_kernel(x0: cute.Tensor, x1: cute.Tensor, x2: cute.Tensor, y0: cute.Tensor,
                y1: cute.Tensor, blk: cutlass.Constexpr, n: Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < n:
        n_in = len(blk.in_types)
        if cutlass.const_expr(n_in == 1):
            outs = cute_ops.run_block(blk, x0[i])
        elif cutlass.const_expr(n_in == 2):
            outs = cute_ops.run_block(blk, x0[i], x1[i])
        else:
            outs = cute_ops.run_block(blk, x0[i], x1[i], x2[i])
        y0[i] = Int32(outs[0])
        if cutlass.const_expr(len(blk.out_types) == 2):
            y1[i] = Int32(outs[1])


@cute.jit
def selftest_launch(x0: cute.Tensor, x1: cute.Tensor, x2: cute.Tensor, y0: cute.Tensor,
                    y1: cute.Tensor, blk: cutlass.Constexpr, n: Int32):
    grid = (n + THREADS - 1) // THREADS
    _map_kernel(x0, x1, x2, y0, y1, blk, n).launch(grid=(grid, 1, 1), block=(THREADS, 1, 1))


def _in_dtype(blk: PtxBlock):
    return cutlass.Float32 if blk.in_types[0] == "f32" else cutlass.Int32


def fake_args(blk: PtxBlock, n: int):
    from cutlass.cute.runtime import make_fake_compact_tensor

    xs = [make_fake_compact_tensor(_in_dtype(blk), (n,)) for _ in range(3)]
    ys = [make_fake_compact_tensor(cutlass.Int32, (n,)) for _ in range(2)]
    return (*xs, *ys, blk, Int32(n))


def compile_selftest(blk: PtxBlock, n: int = 1 << 16, options: str = ""):
    """cute.compile the self-test for sm_90a; returns the compiled object (artifacts kept)."""
    return sass.compile_sm90(selftest_launch, *fake_args(blk, n), options=options)


def sass_of_selftest(blk: PtxBlock, n: int = 1 << 16) -> str:
    return sass.disassemble(compile_selftest(blk, n).artifacts.CUBIN)


def run_selftest(blk: PtxBlock, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run the block on the GPU; inputs as for ``emulator.run_block`` (uint32 words or
    float32 arrays), all of one length.  Returns uint32 arrays, one per output."""
    import torch
    from cutlass.cute.runtime import from_dlpack

    n = len(inputs[0])
    dev = torch.device("cuda")
    f32 = blk.in_types[0] == "f32"

    def to_dev(a):
        a = np.ascontiguousarray(a, np.float32 if f32 else np.uint32)
        t = torch.from_numpy(a if f32 else a.view(np.int32))
        return t.to(dev)

    xs = [to_dev(a) for a in inputs]
    while len(xs) < 3:
        xs.append(torch.zeros_like(xs[0]))
    ys = [torch.zeros(n, dtype=torch.int32, device=dev) for _ in range(2)]
    args = [from_dlpack(t, assumed_align=16) for t in xs + ys]
    compiled = cute.compile(selftest_launch, *args, blk, Int32(n))
    compiled(*args, Int32(n))
    torch.cuda.synchronize()
    return [ys[k].cpu().numpy().view(np.uint32) for k in range(len(blk.out_types))]
