"""Packed 16-bit elementwise kernels (CuTe DSL): B1 SiLU, B4 fused SwiGLU, FP16 sweep.

What it does: streams 1..3 contiguous BF16/FP16 inputs to 1..2 outputs.  Each thread
moves 16-byte chunks (8 values = four packed pairs) with 128-bit loads/stores and runs
one inline PTX block per pair (``kernels/elementwise_ops.py``): the packed polynomial
block generated in asm/ (``poly``: fma.rn.{bf16,f16}x2, no MUFU) or the SFU comparator
(``native``).

Layouts:
* ``flat``   every tensor is the same n elements (any contiguous shape, flattened);
             n % 8 leftover elements are done by a scalar tail (one pair word per
             element, upper lane a copy) with the same block, so tail and body agree.
* ``concat`` SwiGLU on a fused gate-up projection ``[rows, 2H]`` (gate = columns
             0..H-1, up = H..2H-1); needs H % 8 == 0 so both halves stay 16-byte
             aligned.  Outputs/grad are ``[rows, H]``; the backward writes
             ``d_gate_up`` ``[rows, 2H]`` in the same layout.

Grid: ``min(ceil(chunks / (256*U)), SMs * 8)`` blocks of 256 threads, grid-stride
(8 blocks x 256 = the 2,048-thread maximum per Hopper SM).  Each thread keeps U chunks
per input in flight before any math (U*16 B; U = 4 for one input, 2 for more) so the
loads overlap: at ~4 TB/s and ~1 us latency an SM needs ~30 KB in flight.

Tuning (``ElementwiseTune``, part of the key; the default is the behaviour above, with
byte-identical SASS): grid policy ``balanced`` / ``resident`` (every block runs the same
number of full groups; ``resident`` also caps the grid at the blocks that fit at once for
the kernel's register count), unroll U, a ``pred`` remainder (one more U-deep pass with clamped loads and
bounds-checked stores instead of a U=1 loop), cache hints ``stream`` (ld.global.nc +
st.global.cs; inputs must not alias outputs) / ``stream_na`` (ld.global.L1::no_allocate +
st.global.cs) and
``min_blocks`` (nvvm.minctasm: caps registers so that many 256-thread blocks fit per SM).
Measured side by side by bench/elementwise_variants.py; see docs/NOTES.md.

Constraints: n < 2**31 (32-bit indexing), tensors 16-byte aligned (the Python side
checks).  Compile: ``ElementwiseKernel(key).compile()``; run via the torch API in
``flash_attn_poly/activations.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from flash_attn_poly.kernels import compile_cache, elementwise_ops as ops

THREADS = 256
BLOCKS_PER_SM = 8          # 8 x 256 = 2,048 resident threads per SM on sm_90
CHUNK = 8                  # values per 16-byte chunk

# Index roles of each tensor per layout: which chunk of the tensor belongs to output chunk c.
_ROLES = {
    ("flat", 1, 1): (("flat",), ("flat",)),
    ("flat", 2, 1): (("flat", "flat"), ("flat",)),
    ("flat", 3, 2): (("flat", "flat", "flat"), ("flat", "flat")),
    ("concat", 2, 1): (("gate", "up"), ("flat",)),
    ("concat", 3, 2): (("gate", "up", "flat"), ("gate", "up")),
}


@dataclass(frozen=True)
class ElementwiseTune:
    """Compile-time and launch tuning; the default reproduces the untuned kernel exactly."""
    unroll: int = 0            # chunks per input in flight; 0 = unroll_for(kind) (4 / 2)
    remainder: str = "u1"      # "u1": leftover chunks one at a time; "pred": one U-deep pass
    cache: str = "default"     # "stream": ld.global.nc + st.global.cs; "stream_na": L1::no_allocate
                               # loads + st.global.cs (stream needs inputs not aliasing outputs)
    grid: str = "default"      # host grid policy: "default" | "balanced" | "resident" (grid_size)
    min_blocks: int = 0        # > 0: nvvm.minctasm (register cap for this many blocks per SM)

    def __post_init__(self):
        if self.unroll not in (0, 1, 2, 4, 8):
            raise ValueError(f"unroll must be 0 (auto), 1, 2, 4 or 8, got {self.unroll!r}")
        if self.remainder not in ("u1", "pred"):
            raise ValueError(f"remainder must be 'u1' or 'pred', got {self.remainder!r}")
        if self.cache not in ("default", "stream", "stream_na"):
            raise ValueError(f"cache must be 'default', 'stream' or 'stream_na', got {self.cache!r}")
        if self.grid not in ("default", "balanced", "resident"):
            raise ValueError(f"grid must be 'default', 'balanced' or 'resident', got {self.grid!r}")
        if not 0 <= self.min_blocks <= BLOCKS_PER_SM:
            raise ValueError(f"min_blocks must be in 0..{BLOCKS_PER_SM}, got {self.min_blocks!r}")


@dataclass(frozen=True)
class ElementwiseKey:
    """Everything a compiled kernel depends on; its hash is its content."""
    kind: str                 # see elementwise_ops.ARITY
    dtype: str                # "bf16" | "f16"
    evaluator: str = "poly"   # "poly" | "native"
    layout: str = "flat"      # "flat" | "concat"
    program_bits: tuple = field(default=())  # coefficient bits the poly block embeds
    tune: ElementwiseTune = ElementwiseTune()

    def __post_init__(self):
        if self.kind not in ops.ARITY:
            raise ValueError(f"unknown elementwise kind {self.kind!r}; known: {sorted(ops.ARITY)}")
        if self.dtype not in ("bf16", "f16"):
            raise ValueError(f"dtype must be 'bf16' or 'f16', got {self.dtype!r}")
        if self.evaluator not in ("poly", "native"):
            raise ValueError(f"evaluator must be 'poly' or 'native', got {self.evaluator!r}")
        if self.dtype == "bf16" and self.kind not in ops.BF16_KINDS:
            raise ValueError(f"BF16 kernels are {ops.BF16_KINDS}, not {self.kind!r}")
        if self.dtype == "f16" and (self.kind.split("_")[0] not in ops.SWEEP_FNS
                                    or self.evaluator != "poly"):
            raise ValueError(f"FP16 kernels are the poly sweep kinds <fn>_fwd/<fn>_bwd for fn in "
                             f"{ops.SWEEP_FNS}, not {self.kind!r}/{self.evaluator!r}")
        if self.layout not in ("flat", "concat"):
            raise ValueError(f"layout must be 'flat' or 'concat', got {self.layout!r}")
        if self.layout == "concat" and not self.kind.startswith("swiglu"):
            raise ValueError("the concatenated [gate | up] layout is for swiglu kinds only")

    def __hash__(self) -> int:
        # every launch looks its compiled kernel up by this key: hash the nested fields once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.kind, self.dtype, self.evaluator, self.layout, self.program_bits, self.tune))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def cutlass_dtype(self):
        return cutlass.BFloat16 if self.dtype == "bf16" else cutlass.Float16


# Host grid policy of the API's launches per kind (activations._grid), where one was measured
# better than "default" (docs/MEASURED.md, "Elementwise grid policy").  Host-side only (the same
# kernel; tests/test_elementwise_variants.py models every chunk once).
GRID_POLICY = {"silu_fwd": "balanced"}


def grid_size(n_chunks: int, unroll: int, sm_count: int, policy: str = "default",
              resident: int = BLOCKS_PER_SM) -> int:
    """Blocks to launch (THREADS each, grid-stride over groups of THREADS * unroll chunks).

    ``default``: min(groups, SMs * 8); the last partial round (up to ~a group per block)
    runs in the remainder loop.  ``balanced``: rounds = ceil(groups / cap), grid =
    ceil(groups / rounds), so every block runs `rounds` full groups and at most a partial
    last one (B1 fwd, 132 SMs: 7168 groups -> 1024 blocks x 7 rounds, no remainder).
    ``resident``: balanced with cap = SMs * `resident` (blocks that fit at once, see
    resident_blocks), so no block waits for a second wave."""
    groups = max(1, math.ceil(n_chunks / (THREADS * unroll)))
    if policy == "default":
        return min(groups, sm_count * BLOCKS_PER_SM)
    cap = sm_count * (resident if policy == "resident" else BLOCKS_PER_SM)
    return math.ceil(groups / math.ceil(groups / cap))


def resident_blocks(regs: int, smem: int = 0) -> int:
    """256-thread blocks per sm_90 SM that fit with `regs` registers per thread (register
    file 64K, allocated per warp in units of 256); at most 8 (2,048 threads)."""
    per_warp = math.ceil(regs * 32 / 256) * 256
    return max(1, min(BLOCKS_PER_SM, (65536 // per_warp) // (THREADS // 32)))


class ElementwiseKernel:
    """One compiled streaming kernel for an ``ElementwiseKey`` (compile-time config only)."""

    def __init__(self, key: ElementwiseKey):
        self.key = key
        self.n_in, self.n_out = ops.ARITY[key.kind]
        self.in_roles, self.out_roles = _ROLES[(key.layout, self.n_in, self.n_out)]
        if key.evaluator == "poly":
            self.poly = ops.poly_block(key.kind, key.dtype)
        else:
            self.poly = None
            self.ptx, self.constraints, _ = ops.native_block(key.kind, key.dtype)
        # (x, g) poly kinds: the block sees x only; g * f'(x) is one more packed multiply.
        self.grad_mul = ops.grad_mul(key.kind, key.dtype, key.evaluator)
        self.tune = key.tune
        self.unroll = key.tune.unroll or self.unroll_for(key.kind)

    @staticmethod
    def unroll_for(kind: str) -> int:
        """Chunks per input in flight per thread: 16 B each; 4 for one input, 2 for more
        keeps the live registers under ~64 per thread (no spills, >= 50% occupancy)."""
        return 4 if ops.ARITY[kind][0] == 1 else 2

    # ---- device side ----------------------------------------------------------------

    @cute.jit
    def _chunk_index(self, role: cutlass.Constexpr, c: Int32, h8) -> Int32:
        """Chunk of a tensor that output chunk c reads or writes (concat: row-major [rows, 2H]).

        h8 (chunks per half row) is a host-built FastDivmod divisor: a runtime integer
        division would cost ~20 instructions and a MUFU.RCP per chunk."""
        idx = c
        if cutlass.const_expr(role != "flat"):
            row = c // h8
            idx = c + row * h8.divisor    # gate: row*2*h8 + (c - row*h8)
            if cutlass.const_expr(role == "up"):
                idx = idx + h8.divisor
        return idx

    @cute.jit
    def _load(self, gT: cute.Tensor, idx: Int32) -> cute.Tensor:
        rT = cute.make_rmem_tensor((CHUNK,), self.key.cutlass_dtype)
        if cutlass.const_expr(self.tune.cache != "default"):
            # "stream": ld.global.nc.v4 (LDG.E.128.CONSTANT); "stream_na":
            # ld.global.L1::no_allocate.v4 (LDG.E.NA.128).  The DSL allows only one of the two.
            hint = (dict(invariant=True) if self.tune.cache == "stream" else
                    dict(l1c_evict_priority=cute.nvgpu.CacheEvictionPriority.NO_ALLOCATE))
            atom = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), self.key.cutlass_dtype,
                                       num_bits_per_copy=128, **hint)
            cute.copy(atom, gT[(None, idx)], rT)
        else:
            cute.autovec_copy(gT[(None, idx)], rT)   # one LDG.E.128
        return rT

    @cute.jit
    def _store(self, rT: cute.Tensor, gT: cute.Tensor, idx: Int32):
        if cutlass.const_expr(self.tune.cache != "default"):
            atom = cute.make_copy_atom(           # st.global.cs.v4 (STG.E.EF.128)
                cute.nvgpu.CopyR2GOp(), self.key.cutlass_dtype, num_bits_per_copy=128,
                store_cache_mode=cute.nvgpu.StoreCacheMode.STREAMING)
            cute.copy(atom, rT, gT[(None, idx)])
        else:
            cute.autovec_copy(rT, gT[(None, idx)])   # one STG.E.128

    def _evaluate(self, words: list) -> tuple:
        """One pair through the block (plus the g multiply for (x, g) poly kinds)."""
        if self.poly is None:
            return ops.run_ptx(self.ptx, self.constraints, self.n_out, *words)
        if self.grad_mul:
            (d,) = ops.run_poly(self.poly, words[0])
            return ops.run_ptx(self.grad_mul, "=r,r,r", 1, d, words[1])
        return ops.run_poly(self.poly, *words)

    @cute.jit
    def _compute(self, r_ins: list, r_outs: list):
        """Four packed pairs per chunk, one PTX block each."""
        w_ins = [cute.recast_tensor(r, Uint32) for r in r_ins]
        w_outs = [cute.recast_tensor(r, Uint32) for r in r_outs]
        for i in cutlass.range_constexpr(CHUNK // 2):
            res = self._evaluate([w[i] for w in w_ins])
            for j in cutlass.range_constexpr(self.n_out):
                w_outs[j][i] = res[j]

    @cute.jit
    def _do_chunks(self, g_ins: list, g_outs: list, first: Int32, stride: Int32,
                   count: cutlass.Constexpr, h8, limit=None):
        """`count` chunks first, first+stride, ...: all loads issued before any math.
        With `limit` (chunk count) the pass is bounds-checked: loads read chunk
        min(c, limit - 1) (always valid, so they still issue back to back), stores of
        chunks c >= limit are skipped."""
        loaded = []
        for k in cutlass.range_constexpr(count):
            c = first + k * stride
            if cutlass.const_expr(limit is not None):
                c = cutlass.min(c, limit - 1)
            loaded.append([self._load(g, self._chunk_index(role, c, h8))
                           for g, role in zip(g_ins, self.in_roles)])
        for k in cutlass.range_constexpr(count):
            c = first + k * stride
            r_outs = [cute.make_rmem_tensor((CHUNK,), self.key.cutlass_dtype)
                      for _ in range(self.n_out)]
            self._compute(loaded[k], r_outs)
            if cutlass.const_expr(limit is None):
                for r, g, role in zip(r_outs, g_outs, self.out_roles):
                    self._store(r, g, self._chunk_index(role, c, h8))
            else:
                if c < limit:
                    for r, g, role in zip(r_outs, g_outs, self.out_roles):
                        self._store(r, g, self._chunk_index(role, c, h8))

    @cute.jit
    def _tail_element(self, m_ins: list, m_outs: list, idx: Int32):
        """One element through the same pair block (upper lane = a copy, discarded)."""
        w_ins = []
        for m in m_ins:
            r = cute.make_rmem_tensor((2,), self.key.cutlass_dtype)
            r[0] = m[idx]
            r[1] = m[idx]
            w_ins.append(cute.recast_tensor(r, Uint32)[0])
        res = self._evaluate(w_ins)
        for j in cutlass.range_constexpr(self.n_out):
            w = cute.make_rmem_tensor((1,), Uint32)
            w[0] = res[j]
            m_outs[j][idx] = cute.recast_tensor(w, self.key.cutlass_dtype)[0]

    @cute.kernel
    def kernel(self, mI0: cute.Tensor, mI1: cute.Tensor, mI2: cute.Tensor,
               mO0: cute.Tensor, mO1: cute.Tensor, n: Int32, n_chunks: Int32,
               n_groups: Int32, h8):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        m_ins = [mI0, mI1, mI2][: self.n_in]
        m_outs = [mO0, mO1][: self.n_out]
        g_ins = [cute.zipped_divide(m, (CHUNK,)) for m in m_ins]
        g_outs = [cute.zipped_divide(m, (CHUNK,)) for m in m_outs]

        tid = bidx * THREADS + tidx
        n_threads = gdim * THREADS
        group = n_threads * self.unroll
        for g in cutlass.range(n_groups):           # full groups: U chunks, no predicates
            self._do_chunks(g_ins, g_outs, g * group + tid, n_threads, self.unroll, h8)
        if cutlass.const_expr(self.tune.remainder == "pred"):
            first = n_groups * group + tid          # leftover < one group: one pass
            if first < n_chunks:
                self._do_chunks(g_ins, g_outs, first, n_threads, self.unroll, h8, n_chunks)
        else:
            for c in cutlass.range(n_groups * group + tid, n_chunks, n_threads):
                self._do_chunks(g_ins, g_outs, c, n_threads, 1, h8)
        if cutlass.const_expr(self.key.layout == "flat"):
            if tid < n - n_chunks * CHUNK:        # n % 8 scalar tail
                self._tail_element(m_ins, m_outs, n_chunks * CHUNK + tid)

    # ---- host side ------------------------------------------------------------------

    @cute.jit
    def __call__(self, mI0: cute.Tensor, mI1: cute.Tensor, mI2: cute.Tensor,
                 mO0: cute.Tensor, mO1: cute.Tensor, n: Int32, h8: Int32, grid: Int32,
                 stream):
        # Divisions on the host side of the launch: none of them reaches the kernel.
        n_chunks = n // CHUNK
        n_groups = n_chunks // (grid * THREADS * self.unroll)
        h8_div = cute.fast_divmod_create_divisor_v2(h8)
        launch = dict(grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream)
        if cutlass.const_expr(self.tune.min_blocks > 0):
            # preferred_smem_carveout set: else the DSL queries the (absent) device here
            launch.update(min_blocks_per_mp=self.tune.min_blocks,
                          max_number_threads=[THREADS, 1, 1], preferred_smem_carveout=0)
        self.kernel(mI0, mI1, mI2, mO0, mO1, n, n_chunks, n_groups, h8_div).launch(**launch)

    def fake_args(self):
        """Fake 16-byte-aligned 1-D tensors of symbolic length (one symbol per tensor)."""
        dt = self.key.cutlass_dtype

        def fake():
            return cute.runtime.make_fake_tensor(dt, (cute.sym_int(),), stride=(1,),
                                                 assumed_align=16)
        return [fake() for _ in range(5)] + [Int32(0), Int32(0), Int32(1)]

    def compile(self, options: str = ""):
        """cute.compile against fake tensors, uncached (options: e.g. --keep-cubin); the
        result takes torch tensors and launches on torch's current stream."""
        return compile_cache.compile_tvm_ffi(self, self.fake_args(), options)


def _build(key: ElementwiseKey):
    kern = ElementwiseKernel(key)
    return kern, kern.fake_args()


def get_compiled(key: ElementwiseKey):
    """Compiled kernel for `key` (kernels/compile_cache.py: memory, disk, then compile)."""
    return compile_cache.compiled("elementwise", key, lambda: _build(key))


def program_bits(kind: str, dtype: str, evaluator: str) -> tuple:
    """Coefficient bits and clamp of the programs the poly block embeds (cache key part)."""
    if evaluator != "poly":
        return ()
    progs = ops.poly_programs(kind, dtype)
    return tuple((tuple(p.get("coeffs_bits") or p["coeffs"]), p["L_c"]) for p in progs)
