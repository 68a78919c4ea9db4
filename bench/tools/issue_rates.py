"""Per-SM issue rates of the instructions our score stages are made of (H200 microbenchmark).

Why: ANCHORS.md has MUFU (tanh, ex2) and FMA rates, but not the conversions around a packed
polynomial block: cvt.rn.{f16,bf16}x2.f32 (SASS F2FP, also the P pack of every mode) and the
f16 -> f32 unpack (HADD2.F32).  If F2FP ran at MUFU rate, or on the MUFU pipe, a poly pair
that replaces two MUFU.TANH with one F2FP and ~20 FMA-pipe ops would free little of the pipe
it is meant to relieve.  This measures each op alone and mixed 1:1 with tanh.approx.

Method: every thread runs 8 independent chains; one inline-asm call applies UNROLL ops to
each chain (ops depend on the chain's previous value, so nothing folds); a runtime loop
repeats the call.  Thread 0 of each CTA reads %clock64 before and after (the reads are
volatile asm tied to the chains' data, so the work cannot move across them) and %smid.
CTAS_PER_SM * SMs CTAs of 512 threads; the block scheduler may place them unevenly (the first
run, c1595e0, assumed 2 per SM and read ~1.33x too high: MUFU 21.3/clk), so the rate of an SM
is the thread-ops of the CTAs it ran / (last end - first start) on its clock, and a row is
the median over SMs.  Values are whatever the chains produce (NaN/Inf included); throughput does not
depend on them for these ops.

    python bench/tools/issue_rates.py [--iters 2000]                  # GPU: bench/out/issue_rates.json (+ .md)
    python bench/tools/issue_rates.py --threads 128 --ctas-per-sm 1 ... # one warp per SM sub-partition

`--threads 128 --ctas-per-sm 1` asks what one warp per quadrant can issue: the attention
forward's score stage runs that way (with ping-pong one consumer warpgroup, i.e. one warp per
quadrant, works on its stage while the other's GEMMs run), and its measured per-block cost
sits at ~2.3x its MUFU-throughput bound (docs/NOTES_attn_fwd.md, eighth session). The
block scheduler may still put two 128-thread CTAs on an SM; the per-SM rate counts them.
    python bench/tools/issue_rates.py --sass                             # CPU: SASS of each op's loop
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # bench/tools, bench/ (protocol)
import protocol  # noqa: E402

THREADS = 512
CTAS_PER_SM = 2
CHAINS = 8
UNROLL = 16

# name -> list of (kind, PTX template); chain i uses entry i % len(list).
# {a}: the chain as an f32 register, {r}: b32 scratch, {h}/{g}: f16 scratch (per chain).
# "mov.b32" between f32/b32/f16 registers of the same bits is free after ptxas.
TANH = ("tanh.approx.f32", "tanh.approx.f32 {a}, {a};")
EX2 = ("ex2.approx.ftz.f32", "ex2.approx.ftz.f32 {a}, {a};")
FMA = ("fma.rn.f32", "fma.rn.f32 {a}, {a}, 0f3F7FFFFF, 0f3A800000;")
HFMA2 = ("fma.rn.f16x2", "mov.b32 {r}, {a}; fma.rn.f16x2 {r}, {r}, {r}, {r}; mov.b32 {a}, {r};")
MINMAX = ("min.f32+max.f32", "min.f32 {a}, {a}, 0f3F000000; max.f32 {a}, {a}, 0fBF000000;")
F2FP_H = ("cvt.rn.f16x2.f32", "cvt.rn.f16x2.f32 {r}, {a}, {a}; mov.b32 {a}, {r};")
F2FP_B = ("cvt.rn.bf16x2.f32", "cvt.rn.bf16x2.f32 {r}, {a}, {a}; mov.b32 {a}, {r};")
UNPACK = ("cvt.f32.f16", "mov.b32 {{{h}, {g}}}, {a}; cvt.f32.f16 {a}, {g};")
PRMT = ("prmt.b32", "mov.b32 {r}, {a}; prmt.b32 {r}, {r}, {r}, 0x1032; mov.b32 {a}, {r};")
OPS = {
    "tanh": [TANH], "ex2": [EX2], "fma.f32": [FMA], "fma.f16x2": [HFMA2], "min+max.f32": [MINMAX],
    "cvt.f16x2.f32": [F2FP_H], "cvt.bf16x2.f32": [F2FP_B], "cvt.f32.f16": [UNPACK], "prmt": [PRMT],
    "tanh+cvt.bf16x2": [TANH, F2FP_B], "tanh+cvt.f16x2": [TANH, F2FP_H],
    "tanh+cvt.f32.f16": [TANH, UNPACK], "tanh+ex2": [TANH, EX2], "tanh+fma.f16x2": [TANH, HFMA2],
}


def asm_text(name: str) -> str:
    """One inline-asm body: chains in $0..$7 (tied in/out), UNROLL ops on each, interleaved."""
    temps = [t for _, t in OPS[name]]
    decl = [".reg .f32 a<8>;", ".reg .b32 r<8>;", ".reg .f16 h<8>, g<8>;"]
    body = [f"mov.b32 a{i}, ${i};" for i in range(CHAINS)]
    for _ in range(UNROLL):
        for i in range(CHAINS):
            body.append(temps[i % len(temps)].format(a=f"a{i}", r=f"r{i}", h=f"h{i}", g=f"g{i}"))
    body += [f"mov.b32 ${i}, a{i};" for i in range(CHAINS)]
    return "{\n" + "\n".join(decl + body) + "\n}"


def ops_per_call(name: str) -> dict:
    """Ops of each kind per asm call per thread."""
    out: dict = {}
    for i in range(CHAINS):
        kind = OPS[name][i % len(OPS[name])][0]
        out[kind] = out.get(kind, 0) + UNROLL
    return out


def _build(name: str, threads: int = THREADS):
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T, dsl_user_op

    text = asm_text(name)

    @dsl_user_op
    def step(vals, *, loc=None, ip=None):
        ops = [Int32(v).ir_value(loc=loc, ip=ip) for v in vals]
        st = llvm.StructType.get_literal([T.i32()] * CHAINS)
        cons = ",".join(["=r"] * CHAINS + [str(i) for i in range(CHAINS)])
        res = llvm.inline_asm(st, ops, text, cons, has_side_effects=False, is_align_stack=False,
                              asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
        return tuple(Int32(llvm.extractvalue(T.i32(), res, [k], loc=loc, ip=ip)) for k in range(CHAINS))

    @dsl_user_op
    def clock_through(v, *, loc=None, ip=None):
        """(%clock64, v) from one volatile asm: v's later uses depend on the clock read."""
        st = llvm.StructType.get_literal([T.i64(), T.i32()])
        res = llvm.inline_asm(st, [Int32(v).ir_value(loc=loc, ip=ip)],
                              "mov.u64 $0, %clock64;\nmov.b32 $1, $2;", "=l,=r,r",
                              has_side_effects=True, is_align_stack=False,
                              asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
        return (Int64(llvm.extractvalue(T.i64(), res, [0], loc=loc, ip=ip)),
                Int32(llvm.extractvalue(T.i32(), res, [1], loc=loc, ip=ip)))

    @dsl_user_op
    def smid(*, loc=None, ip=None):
        return Int32(llvm.inline_asm(T.i32(), [], "mov.u32 $0, %smid;", "=r", has_side_effects=True,
                                     is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    @cute.kernel
    def kern(seed: cute.Tensor, out: cute.Tensor, cycles: cute.Tensor, iters: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        g = bidx * threads + tidx
        x0 = seed[g]
        t0, x0 = clock_through(x0)
        # eight named chains (the DSL carries named values through a dynamic loop)
        v0, v1, v2, v3 = x0, x0 + Int32(977), x0 + Int32(1954), x0 + Int32(2931)
        v4, v5, v6, v7 = x0 + Int32(3908), x0 + Int32(4885), x0 + Int32(5862), x0 + Int32(6839)
        for _ in cutlass.range(iters, unroll=1):
            v0, v1, v2, v3, v4, v5, v6, v7 = step((v0, v1, v2, v3, v4, v5, v6, v7))
        acc = v0 ^ v1 ^ v2 ^ v3 ^ v4 ^ v5 ^ v6 ^ v7
        t1, acc = clock_through(acc)
        out[g] = acc
        if tidx == 0:
            cycles[bidx, 0] = t0
            cycles[bidx, 1] = t1
            cycles[bidx, 2] = Int64(smid())

    @cute.jit
    def launch(seed: cute.Tensor, out: cute.Tensor, cycles: cute.Tensor, iters: Int32, n_cta: Int32):
        kern(seed, out, cycles, iters).launch(grid=(n_cta, 1, 1), block=(threads, 1, 1))

    return launch


def sass_of(name: str) -> str:
    from cutlass import Int32
    from cutlass.cute.runtime import make_fake_compact_tensor
    import cutlass
    from flash_attn_poly.kernels import sass

    n_cta = 264
    args = (make_fake_compact_tensor(cutlass.Int32, (n_cta * THREADS,)),
            make_fake_compact_tensor(cutlass.Int32, (n_cta * THREADS,)),
            make_fake_compact_tensor(cutlass.Int64, (n_cta, 3)), Int32(10), Int32(n_cta))
    return sass.sass_of(_build(name), *args)


def measure(name: str, iters: int, threads: int = THREADS, ctas_per_sm: int = CTAS_PER_SM) -> dict:
    import torch
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32
    from cutlass.cute.runtime import from_dlpack

    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    n_cta = n_sm * ctas_per_sm
    seed = torch.randint(0x3E000000, 0x3F800000, (n_cta * threads,), dtype=torch.int32, device="cuda")
    out = torch.full_like(seed, -1)
    cyc = torch.zeros(n_cta, 3, dtype=torch.int64, device="cuda")
    args = [from_dlpack(t, assumed_align=16) for t in (seed, out, cyc)]
    fn = cute.compile(_build(name, threads), *args, Int32(iters), Int32(n_cta))
    fn(*args, Int32(iters), Int32(n_cta))          # warm-up
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    fn(*args, Int32(iters), Int32(n_cta))
    ev[1].record()
    torch.cuda.synchronize()
    ms = ev[0].elapsed_time(ev[1])
    per_thread = {k: v * iters for k, v in ops_per_call(name).items()}
    total_thread_ops = sum(per_thread.values())
    by_sm: dict = {}
    for t0, t1, sm in cyc.cpu().tolist():
        lo, hi, n = by_sm.get(sm, (t0, t1, 0))
        by_sm[sm] = (min(lo, t0), max(hi, t1), n + 1)
    # thread-ops per clock of each SM over the span its CTAs ran; the row: median over SMs
    rates = sorted(n * threads * total_thread_ops / (hi - lo) for lo, hi, n in by_sm.values())
    rate = statistics.median(rates)
    cycles = statistics.median(hi - lo for lo, hi, _ in by_sm.values())
    return {"op": name, "ops_per_clk_per_sm": rate,
            "per_kind_per_clk_per_sm": {k: rate * v / total_thread_ops for k, v in per_thread.items()},
            "sm_rate_range": [rates[0], rates[-1]], "median_sm_cycles": cycles, "kernel_ms": ms,
            "implied_sm_mhz": cycles / (ms * 1e3), "n_sm": n_sm, "sms_used": len(by_sm),
            "threads": threads, "ctas_per_sm": ctas_per_sm,
            "max_ctas_on_one_sm": max(n for _, _, n in by_sm.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--ops", default="", help="comma-separated subset of OPS names")
    ap.add_argument("--sass", action="store_true", help="print each op's SASS opcode histogram (CPU)")
    ap.add_argument("--threads", type=int, default=THREADS, help="threads per CTA (128: one warp per quadrant)")
    ap.add_argument("--ctas-per-sm", type=int, default=CTAS_PER_SM, help="CTAs launched per SM")
    protocol.add_json_arg(ap, "issue_rates")
    a = ap.parse_args(argv)
    names = [n for n in OPS if not a.ops or n in a.ops.split(",")]
    if a.sass:
        from flash_attn_poly.kernels import sass
        for n in names:
            h = sass.histogram(sass_of(n))
            print(f"{n:34s} " + " ".join(f"{k}:{v}" for k, v in h.most_common(6)))
        return 0
    import datetime

    import torch
    path = protocol.output_path(a.json, "issue_rates")
    rows = [measure(n, a.iters, a.threads, a.ctas_per_sm) for n in names]
    print(f"{'op':34s} {'ops/clk/SM':>10s}  per kind")
    for r in rows:
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in r["per_kind_per_clk_per_sm"].items())
        print(f"{r['op']:34s} {r['ops_per_clk_per_sm']:10.1f}  {kinds}  ({r['implied_sm_mhz']:.0f} MHz)")
    doc = {"device": torch.cuda.get_device_name(0), "date": datetime.date.today().isoformat(),
           "commit": protocol.commit_id(),
           "protocol": f"{a.ctas_per_sm} x SMs CTAs of {a.threads} threads, {CHAINS} independent chains "
                       f"per thread, {UNROLL} ops per chain per asm call, {a.iters} calls; per SM "
                       "(%smid): thread-ops of its CTAs / (last %clock64 end - first start); "
                       "median over SMs; one warm-up launch",
           "rows": rows}
    table = protocol.markdown_table(
        [{"op": r["op"], "ops/clk/SM": r["ops_per_clk_per_sm"],
          "per kind": ", ".join(f"{k} {v:.1f}" for k, v in r["per_kind_per_clk_per_sm"].items()),
          "SM MHz": f"{r['implied_sm_mhz']:.0f}"} for r in rows], ["op", "ops/clk/SM", "per kind", "SM MHz"])
    protocol.write_results(path, doc, f"# Per-SM issue rates ({doc['device']}, {doc['date']}, commit "
                                      f"{doc['commit']})\n\nProtocol: {doc['protocol']}.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
