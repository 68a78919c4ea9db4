"""Backward correctness + timing in one GPU call (owner: attention backward).

python bench/attn_bwd_check.py [--time] [--modes softmax,softcap,sigmoid] [--skip-check] [--deterministic]
                                [--prepost]
Errors: max |kernel - ref| / max |ref| per gradient, ref = FP64 autograd of
flash_attn_poly.reference.attention_ref on the same BF16 inputs, with the kernel fed the
reference's own O (rounded to BF16) and LSE.  Timing: CUDA events, median of 30 after 5
warm-ups, backward alone (pre/post-processing included), FA4 side by side when importable.
--deterministic (with --time): also time the deterministic build (attn_bwd(deterministic=True))
next to the default one per mode, and check that two of its runs are bitwise equal.
--prepost: anchor shape, the backward per mode with FLASH_ATTN_POLY_PREPOST=torch and =cute
side by side, and the pre+post work alone (preprocess, accumulator memset, postprocess) for
both, plus a check that the two paths' outputs agree (post bitwise, lse2 bitwise, dsum error).
"""
import argparse
import os
import statistics
import sys

import torch

from flash_attn_poly import reference
from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd

# One list of check cases: the GPU test's (poly modes are judged there against the
# per-column split reference, which this exact-function check cannot do).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_attn_bwd_gpu import CASES as QUICK  # noqa: E402


def grads_ref(q, k, v, do, mode, causal, softcap):
    qs, ks, vs = (t.double().requires_grad_() for t in (q, k, v))
    o, lse = reference.attention_ref(qs, ks, vs, mode, causal=causal, softcap=softcap)
    o.backward(do.double())
    return o, lse, qs.grad, ks.grad, vs.grad


def run_case(case, dtype=torch.bfloat16, **kw):
    b, sq, sk, hq, hkv, d, causal, mode = case[:8]
    ev = case[8] if len(case) > 8 else "native"
    g = torch.Generator(device="cuda").manual_seed(hash(case) % 2**31)
    mk = lambda s, h: torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    q, k, v, do = mk(sq, hq), mk(sk, hkv), mk(sk, hkv), mk(sq, hq)
    softcap = 50.0 if mode == "softcap" else None
    o, lse, dq_r, dk_r, dv_r = grads_ref(q, k, v, do, mode, causal, softcap)
    lse_in = None if lse is None else lse.detach().float()
    dq, dk, dv = attn_bwd(do, q, k, v, o.detach().to(dtype), lse_in, mode=mode, evaluator=ev,
                          causal=causal, softcap=softcap, **kw)
    torch.cuda.synchronize()
    errs = [((a.double() - r).abs().max() / r.abs().max()).item() for a, r in ((dq, dq_r), (dk, dk_r), (dv, dv_r))]
    finite = all(torch.isfinite(t).all().item() for t in (dq, dk, dv))
    if max(errs) > 2e-2:  # diagnostics: norm ratios and where the worst dv error sits
        ratio = [(a.double().norm() / r.norm()).item() for a, r in ((dq, dq_r), (dk, dk_r), (dv, dv_r))]
        bad = (dv.double() - dv_r).abs()
        print("  norm ratios dq dk dv", ["%.3g" % x for x in ratio], "worst dv at", list(bad.flatten().argmax().unravel_index(bad.shape) if hasattr(bad.flatten().argmax(), 'unravel_index') else [int(bad.argmax())]),
              "dv row err", bad.amax(dim=(0, 2, 3))[:: max(1, sk // 16)].tolist()[:16])
    return errs, finite


def bench(fn, n=30, warm=5):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(n):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(e))
    return statistics.median(ts)


def _bitwise_repeat(fn):
    a, b = fn(), fn()
    return all(torch.equal(x, y) for x, y in zip(a, b))


def fa4_bwd_fns(q, k, v, do):
    """[(name, callable)]: FA4's backward (autograd.grad of a retained graph) at softcap 0 and
    50 on these inputs; the rows built before a failure
    (a message says why) when flash-attn-4 is missing or fails."""
    fns = []
    try:
        from flash_attn.cute.interface import flash_attn_func
        for sc in (0.0, 50.0):
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            out = flash_attn_func(qq, kk, vv, causal=True, softcap=sc)
            out = out[0] if isinstance(out, tuple) else out
            fns.append((f"FA4 softcap={sc}", lambda out=out, qq=qq, kk=kk, vv=vv:
                        torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)))
    except Exception as e:  # noqa: BLE001 - report and time the rest
        print("FA4 unavailable:", repr(e)[:200])
    return fns


def time_anchor(modes, deterministic=False):
    b, s, hq, hkv, d = 1, 4096, 32, 8, 128
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v, do = mk(hq), mk(hkv), mk(hkv), mk(hq)
    o = torch.randn_like(q)
    lse = torch.randn(b, hq, s, device="cuda") + 10.0
    rows = []
    for mode in modes:
        sc = 50.0 if mode == "softcap" else None
        flops = 2.5 * 4 * b * hq * s * s * d / 2
        for det in (False, True) if deterministic else (False,):
            fn = lambda: attn_bwd(do, q, k, v, o, lse, mode=mode, causal=True, softcap=sc, deterministic=det)
            ms = bench(fn)
            tag = f" deterministic (bitwise repeat: {_bitwise_repeat(fn)})" if det else ""
            rows.append((f"ours {mode}{tag}", ms, flops / ms / 1e9))
    from flash_attn_poly.kernels import attn_bwd_prepost as pp

    def prepost():
        pp.preprocess(do, o, lse, True, True, "e", 128)
        acc = pp.accumulators(q, k)
        pp.postprocess(*acc, 0.1, q.dtype)
    rows.append(("torch pre+post only (in ours softmax)", bench(prepost), 0.0))
    for name, fn in fa4_bwd_fns(q, k, v, do):
        ms = bench(fn)
        rows.append((name, ms, flops / ms / 1e9))
    return rows


def time_prepost(modes):
    """Rows (what, torch ms, cute ms) at the anchor shape; env var read per call."""
    from flash_attn_poly.kernels import attn_bwd_prepost as pp_t, attn_bwd_prepost_sm90 as pp_c
    from flash_attn_poly.kernels.attn_bwd_sm90 import PREPOST_ENV
    b, s, hq, hkv, d = 1, 4096, 32, 8, 128
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v, do, o = mk(hq), mk(hkv), mk(hkv), mk(hq), mk(hq)
    lse = torch.randn(b, hq, s, device="cuda") + 10.0
    old = os.environ.get(PREPOST_ENV)
    rows = []
    for mode in modes:
        sc = 50.0 if mode == "softcap" else None
        ms = []
        for impl in ("torch", "cute"):
            os.environ[PREPOST_ENV] = impl
            ms.append(bench(lambda: attn_bwd(do, q, k, v, o, lse, mode=mode, causal=True, softcap=sc)))
        rows.append((f"bwd {mode} (incl. pre/post)", *ms))
    if old is None:
        os.environ.pop(PREPOST_ENV, None)
    else:
        os.environ[PREPOST_ENV] = old

    def prepost(pp):
        def fn():
            pp.preprocess(do, o, lse, True, True, "e", 128)
            acc = pp_t.accumulators(q, k)
            pp.postprocess(*acc, 0.1, q.dtype)
        return fn
    rows.append(("pre + memset + post", bench(prepost(pp_t)), bench(prepost(pp_c))))
    rows.append(("pre only", bench(lambda: pp_t.preprocess(do, o, lse, True, True, "e", 128)),
                 bench(lambda: pp_c.preprocess(do, o, lse, True, True, "e", 128))))
    acc = pp_t.accumulators(q, k)
    for a in acc:
        a.normal_()
    rows.append(("post only", bench(lambda: pp_t.postprocess(*acc, 0.1, q.dtype)),
                 bench(lambda: pp_c.postprocess(*acc, 0.1, q.dtype))))
    # agreement of the two paths on these inputs
    (lt, dt), (lc, dc) = (pp.preprocess(do, o, lse, True, True, "e", 128) for pp in (pp_t, pp_c))
    same_post = all(torch.equal(x, y) for x, y in zip(pp_t.postprocess(*acc, 0.1, q.dtype),
                                                       pp_c.postprocess(*acc, 0.1, q.dtype)))
    print(f"agreement: lse2 bitwise {torch.equal(lt, lc)}, post bitwise {same_post}, "
          f"dsum max |diff| {(dt - dc).abs().max().item():.3g} (max |dsum| {dt.abs().max().item():.3g})")
    return rows


def _gemma_inputs():
    """Gemma-2 2B attention shape at head_dim 256: B=1 S=8192 H_q=8 H_kv=4."""
    b, s, hq, hkv, d = 1, 8192, 8, 4, 256
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v, do, o = mk(hq), mk(hkv), mk(hkv), mk(hq), mk(hq)
    return q, k, v, do, o, torch.randn(b, hq, s, device="cuda") + 10.0


def time_variants(modes, rounds=5, axes=("lpt",)):
    """Backward variants side by side, alternating order: "prepost" = pre/post torch | cute
    (dQ atomic | async); "lpt" = CTA order single-tile | SectionLptScheduler at the anchor
    shape (B=1 S=4096 Hq=32 Hkv=8 D=128 causal) and, for softcap, at Gemma-2's D = 256
    shape; plus FA4.  Each round times every variant (median of 30 calls), the order
    reversed on odd rounds; a row is the median over rounds."""
    from flash_attn_poly.kernels.attn_bwd_sm90 import PREPOST_ENV
    b, s, hq, hkv, d = 1, 4096, 32, 8, 128
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v, do, o = mk(hq), mk(hkv), mk(hkv), mk(hq), mk(hq)
    lse = torch.randn(b, hq, s, device="cuda") + 10.0
    flops = 2.5 * 4 * b * hq * s * s * d / 2
    old = os.environ.get(PREPOST_ENV)
    variants = []   # (name, fn, flops)

    def add(name, inputs, mode, fl, **kw):
        sc = 50.0 if mode == "softcap" else None
        qq, kk, vv, dd, oo, ll = inputs
        variants.append((name, lambda: attn_bwd(dd, qq, kk, vv, oo, ll, mode=mode, causal=True, softcap=sc, **kw), fl))
    anchor = (q, k, v, do, o, lse)
    for mode in modes:
        if "prepost" in axes:
            for pp in ("torch", "cute"):
                for dq_async in (False, True):
                    def fn(mode=mode, pp=pp, dq_async=dq_async):
                        os.environ[PREPOST_ENV] = pp
                        sc = 50.0 if mode == "softcap" else None
                        return attn_bwd(do, q, k, v, o, lse, mode=mode, causal=True, softcap=sc, dq_async=dq_async)
                    variants.append((f"ours {mode} pre/post={pp} dQ={'async' if dq_async else 'atomic'}", fn, flops))
        if "lpt" in axes:
            for lpt in (False, True):
                add(f"ours {mode} {'lpt' if lpt else 'single-tile'}", anchor, mode, flops, lpt=lpt)
        if "sigmoid_grad" in axes and mode == "sigmoid":   # sigma' rule of the poly block columns
            for rule in ("surrogate", "product"):
                add(f"ours sigmoid/poly grad={rule}", anchor, mode, flops, evaluator="poly", sigmoid_grad=rule,
                    program="sigmoid_attn_n4096")   # the surrogate exists for the BF16 D3 block only
        if "mainloop" in axes:   # per-query-block order v1 | v2, every evaluator of the mode
            for ev in (("native",) if mode == "softmax" else ("native", "poly")):
                for ml in (1, 2):
                    add(f"ours {mode}/{ev} mainloop={ml}", anchor, mode, flops, mainloop=ml, evaluator=ev)
        if "v_with_do" in axes:   # V on the first dO barrier (K, Q, V, dO load order)
            ev = "native" if mode == "softmax" else "poly"
            for vd in (False, True):
                add(f"ours {mode}/{ev} v_with_do={int(vd)}", anchor, mode, flops, v_with_do=vd, evaluator=ev)
        if "head_loop" in axes:   # CTA per KV head over its GQA group, dK/dV stored directly
            for ev in (("native",) if mode == "softmax" else ("native", "poly")):
                for hl in (False, True):
                    add(f"ours {mode}/{ev} head_loop={int(hl)}", anchor, mode, flops, head_loop=hl, evaluator=ev)
        if "dq_tma" in axes:   # staged dQ added by TMA tensor reductions | per-row bulk reductions
            for ev in (("native",) if mode == "softmax" else ("native", "poly")):
                for dt in (False, True):
                    add(f"ours {mode}/{ev} dq_tma={int(dt)}", anchor, mode, flops, dq_tma=dt, evaluator=ev)
        if "zero_dq" in axes:   # head_loop's dQ accumulator zeroed by the pre kernel | a memset
            for ev in (("native",) if mode == "softmax" else ("native", "poly")):
                for zd in (False, True):
                    add(f"ours {mode}/{ev} zero_dq_in_pre={int(zd)}", anchor, mode, flops, zero_dq_in_pre=zd,
                        evaluator=ev, head_loop=True)
        if "m_desc" in axes:   # head_loop's query blocks descending | ascending
            for ev in (("native",) if mode == "softmax" else ("native", "poly")):
                for md in (False, True):
                    add(f"ours {mode}/{ev} m_desc={int(md)}", anchor, mode, flops, m_desc=md, evaluator=ev,
                        head_loop=True)
        if "fast_divmod" in axes:   # head_loop's step split by multiply-shift | integer division
            for ev in (("native",) if mode == "softmax" else ("native", "poly")):
                for fd in (False, True):
                    add(f"ours {mode}/{ev} fast_divmod={int(fd)}", anchor, mode, flops, fast_divmod=fd,
                        evaluator=ev, head_loop=True)
        if "stages" in axes:   # Q/dO pipeline depth, default evaluator of attention() (poly)
            ev = "native" if mode == "softmax" else "poly"
            for st in (2, 3):
                add(f"ours {mode}/{ev} stages={st}", anchor, mode, flops, stages=st, evaluator=ev)
    if "head_loop" in axes:   # Gemma-2 2B (D = 256, GQA 2) and a short anchor (S = 1024: 4x fewer CTAs)
        g = _gemma_inputs()
        fl = 2.5 * 4 * 8 * 8192 * 8192 * 256 / 2
        for ev in ("native", "poly"):
            for hl in (False, True):
                add(f"ours softcap/{ev} D=256 (B=1 S=8192 H 8/4) head_loop={int(hl)}", g, "softcap", fl,
                    head_loop=hl, evaluator=ev)
        short = tuple(t[:, :1024].contiguous() for t in (q, k, v, do, o)) + (lse[:, :, :1024].contiguous(),)
        fl = 2.5 * 4 * b * hq * 1024 * 1024 * d / 2
        for hl in (False, True):
            add(f"ours softmax S=1024 head_loop={int(hl)}", short, "softmax", fl, head_loop=hl)
    if "lpt" in axes:
        g = _gemma_inputs()
        fl = 2.5 * 4 * 8 * 8192 * 8192 * 256 / 2
        for lpt in (False, True):
            add(f"ours softcap D=256 (B=1 S=8192 H 8/4) {'lpt' if lpt else 'single-tile'}", g, "softcap", fl, lpt=lpt)
    if set(axes) != {"sigmoid_grad"}:   # that axis compares ours with ours
        variants += [(name, fn, flops) for name, fn in fa4_bwd_fns(q, k, v, do)]
    per = {name: [] for name, _, _ in variants}
    for r in range(rounds):
        for name, fn, _ in (variants if r % 2 == 0 else variants[::-1]):
            per[name].append(bench(fn))
    if old is None:
        os.environ.pop(PREPOST_ENV, None)
    else:
        os.environ[PREPOST_ENV] = old
    # the same inputs through both settings: equal up to the FP32 order of the adds
    for mode in modes:
        sc = 50.0 if mode == "softcap" else None
        key, xs = (("lpt", (False, True)) if "lpt" in axes else ("stages", (2, 3)) if "stages" in axes
                   else ("mainloop", (1, 2)) if "mainloop" in axes
                   else ("v_with_do", (False, True)) if "v_with_do" in axes
                   else ("head_loop", (False, True)) if "head_loop" in axes
                   else ("zero_dq_in_pre", (False, True)) if "zero_dq" in axes
                   else ("dq_tma", (False, True)) if "dq_tma" in axes
                   else ("m_desc", (False, True)) if "m_desc" in axes
                   else ("fast_divmod", (False, True)) if "fast_divmod" in axes
                   else ("sigmoid_grad", ("surrogate", "product")) if "sigmoid_grad" in axes
                   else ("dq_async", (False, True)))
        if key == "sigmoid_grad" and mode != "sigmoid":
            continue
        ev = {"evaluator": "poly", "program": "sigmoid_attn_n4096"} if key == "sigmoid_grad" else \
            {"evaluator": "poly"} if (key in ("mainloop", "v_with_do", "head_loop", "dq_tma") and mode != "softmax") else \
            {"head_loop": True, **({} if mode == "softmax" else {"evaluator": "poly"})} if key in ("zero_dq_in_pre", "m_desc", "fast_divmod") else {}
        ga, gb = (attn_bwd(do, q, k, v, o, lse, mode=mode, causal=True, softcap=sc, **{key: x}, **ev) for x in xs)
        rel = max(((x.double() - y.double()).norm() / y.double().norm()).item() for x, y in zip(ga, gb))
        print(f"{mode}: {key} off vs on, max rel L2 over dq/dk/dv {rel:.2e}")
    return [(name, statistics.median(per[name]), fl / statistics.median(per[name]) / 1e9) for name, _, fl in variants]


def time_split_wg(rounds=3):
    """D = 256 backward at the Gemma-2 2B shape, softcap: chunked vs split-warpgroup build,
    alternating order; the row is the median over rounds of the median of 10 calls."""
    q, k, v, do, o, lse = _gemma_inputs()
    fns = {name: (lambda sw=sw: attn_bwd(do, q, k, v, o, lse, mode="softcap", causal=True, softcap=50.0,
                                         split_wg=sw))
           for name, sw in (("chunked", False), ("split_wg", True))}
    ga, gb = fns["chunked"](), fns["split_wg"]()
    rel = max(((x.double() - y.double()).norm() / y.double().norm()).item() for x, y in zip(ga, gb))
    print(f"D=256 softcap: chunked vs split_wg, max rel L2 over dq/dk/dv {rel:.2e}")
    per = {n: [] for n in fns}
    for r in range(rounds):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            per[n].append(bench(fns[n], n=10, warm=2))
    return [(n, statistics.median(v)) for n, v in per.items()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--modes", default="softmax")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--deterministic", action="store_true", help="time the deterministic build too")
    ap.add_argument("--prepost", action="store_true",
                    help="time FLASH_ATTN_POLY_PREPOST=torch vs cute (backward and pre/post alone)")
    ap.add_argument("--variants", action="store_true",
                    help="time backward variants side by side, with FA4 (see --axes)")
    ap.add_argument("--axes", default="lpt", help="comma-separated: prepost (pre/post x dQ path), lpt (CTA order), stages (Q/dO pipeline 2 | 3), sigmoid_grad (surrogate | product), mainloop (1 | 2), v_with_do (off | on), head_loop (off | on), zero_dq (head_loop's dQ accumulator zeroed in the pre kernel: off | on), dq_tma (dQ by TMA tensor reductions: off | on; refused since 077dce5, it hangs: needs FLASH_ATTN_POLY_DQ_TMA_DEBUG=1), m_desc (head_loop query blocks descending: off | on), fast_divmod (head_loop step split by multiply-shift: off | on)")
    ap.add_argument("--json", default=None, help="with --variants: write rows + protocol here")
    ap.add_argument("--split-wg", action="store_true", help="time the D=256 chunked vs split-warpgroup backward")
    a = ap.parse_args()
    ok = True
    if not a.skip_check:
        print("| case | dq | dk | dv | finite |")
        for case in QUICK:
            try:
                errs, finite = run_case(case)
                good = finite and max(errs) < 2e-2
                ok &= good
                print(f"| {case} | {errs[0]:.2e} | {errs[1]:.2e} | {errs[2]:.2e} | {finite} {'ok' if good else 'FAIL'} |")
            except Exception as e:  # noqa: BLE001
                ok = False
                print(f"| {case} | ERROR {repr(e)[:300]} |")
            sys.stdout.flush()
    if a.time:
        print("| anchor B=1 S=4096 Hq=32 Hkv=8 D=128 causal | bwd ms | TFLOP/s |")
        for name, ms, tf in time_anchor(a.modes.split(","), a.deterministic):
            print(f"| {name} | {ms:.3f} | {tf:.0f} |")
    if a.prepost:
        print("| anchor B=1 S=4096 Hq=32 Hkv=8 D=128 causal | torch ms | cute ms | torch/cute |")
        for name, t_ms, c_ms in time_prepost(a.modes.split(",")):
            print(f"| {name} | {t_ms:.3f} | {c_ms:.3f} | {t_ms / c_ms:.2f} |")
    if a.split_wg:
        for name, ms in time_split_wg():
            print(f"| D=256 softcap bwd (B=1 S=8192 H 8/4) {name} | {ms:.3f} ms |")
    if a.variants:
        rows = time_variants(a.modes.split(","), axes=tuple(a.axes.split(",")))
        print("| backward (anchor B=1 S=4096 Hq=32 Hkv=8 D=128 causal BF16 unless named) | bwd ms | TFLOP/s |")
        print("|---|---:|---:|")
        for name, ms, tf in rows:
            print(f"| {name} | {ms:.3f} | {tf:.0f} |")
        if a.json:
            import json, datetime, subprocess
            commit = os.environ.get("FAP_COMMIT") or subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
            with open(a.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                           "commit": commit,
                           "axes": a.axes, "protocol": "5 rounds, order reversed on odd rounds; per round the median of 30 "
                                       "CUDA-event-timed calls after 5 warm-ups; row = median over rounds; "
                                       "backward alone (ours: attn_bwd incl. pre/post; FA4: autograd.grad "
                                       "of a retained graph)",
                           "rows": [{"impl": n, "bwd_ms": ms, "tflops": tf} for n, ms, tf in rows]}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
