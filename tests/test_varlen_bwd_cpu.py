"""CPU tests of the varlen backward's host side: the padded packed offsets of the LSE / dsum
buffers (kernels/prepost_launch.py, "Packed sequences"), their torch oracle, the plan's
bwd.varlen rows and check_bwd's refusals."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from flash_attn_poly.kernels import attn_bwd_prepost as ref
from flash_attn_poly.kernels.prepost_launch import (VARLEN_PAD, dq_acc_index, varlen_padded_offset,
                                                   varlen_padded_rows)

LENGTH_LISTS = [[0], [1], [0, 0, 5], [128, 1, 0, 129, 127, 256], [300, 0, 1, 1, 64, 65]]


def _cu(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


@pytest.mark.parametrize("lengths", LENGTH_LISTS + [None] * 4)
def test_padded_blocks_are_aligned_disjoint_and_inside(lengths):
    """Every sequence's padded block [offset, offset + ceil(S / PAD) * PAD) starts on a multiple
    of VARLEN_PAD, holds the sequence, does not overlap the next one's, and ends inside the
    buffer; a run of 100 sequences of one row pads no more than a row block each."""
    if lengths is None:
        rng = random.Random(len(LENGTH_LISTS))
        lengths = [rng.choice([0, 1, 2, 63, 64, 127, 128, 129, rng.randrange(1000)]) for _ in range(rng.randrange(1, 40))]
    cu = _cu(lengths)
    rows = varlen_padded_rows(cu[-1], len(lengths))
    end = 0
    for b, n in enumerate(lengths):
        p = varlen_padded_offset(cu[b], b)
        assert p % VARLEN_PAD == 0 and p >= end
        end = p + -(-n // VARLEN_PAD) * VARLEN_PAD
        assert end <= rows
    assert rows <= cu[-1] + len(lengths) * VARLEN_PAD
    assert varlen_padded_rows(100, 100) <= 100 + 100 * VARLEN_PAD


def test_preprocess_varlen_oracle_matches_the_definition():
    """The oracle: lse2 = LSE * log2 e (-inf -> +inf) and dsum = rowsum(dO o O) at each
    sequence's padded rows, +inf / 0 in its padded tail, NaN in rows nobody owns."""
    g = torch.Generator().manual_seed(0)
    lengths = [3, 0, 130, 1]
    cu = _cu(lengths)
    h, d = 2, 64
    dout = torch.randn(cu[-1], h, d, generator=g).bfloat16()
    out = torch.randn(cu[-1], h, d, generator=g).bfloat16()
    lse = torch.randn(h, cu[-1], generator=g)
    lse[0, 4] = -math.inf
    lse2, dsum = ref.preprocess_varlen(dout, out, lse, cu, True, True)
    owned = set(ref.varlen_owned_rows(cu))
    for b, n in enumerate(lengths):
        p = varlen_padded_offset(cu[b], b)
        for s in range(-(-n // VARLEN_PAD) * VARLEN_PAD):
            if s < n:
                row = cu[b] + s
                want = lse[:, row] * math.log2(math.e)
                want = torch.where(want == -math.inf, math.inf, want)
                torch.testing.assert_close(lse2[0, :, p + s], want)
                torch.testing.assert_close(dsum[0, :, p + s], (dout[row].float() * out[row].float()).sum(-1))
            else:
                assert (lse2[0, :, p + s] == math.inf).all() and (dsum[0, :, p + s] == 0).all()
    assert lse2[0, 0, varlen_padded_offset(cu[2], 2) + 1] == math.inf   # row 4 of the batch: LSE -inf
    free = [r for r in range(lse2.shape[2]) if r not in owned]
    assert free and torch.isnan(lse2[0, :, free]).all() and torch.isnan(dsum[0, :, free]).all()


def _call(mode="softmax", **kw):
    from flash_attn_poly import plan
    base = dict(mode=mode, evaluator="native", dtype="bf16", head_dim=128, batch=8, seqlen_q=4096,
                seqlen_k=4096, heads_q=32, heads_kv=8, causal=True, window=(-1, -1), softmax_scale=128 ** -0.5,
                softcap=30.0 if mode == "softcap" else None, sigmoid_bias=-4.0 if mode == "sigmoid" else None,
                varlen=True)
    base.update(kw)
    return plan.AttnCall(**base)


def test_plan_varlen_backward_rows():
    """Packed calls run the varlen backward (the per-KV-head loop where the dense rule's grid
    fills, no LPT order), sigmoid's per-sequence default bias too, except a deterministic
    backward; dense calls never, and the override refuses those two."""
    from flash_attn_poly import plan
    on = plan.resolve(_call(), 132).bwd
    assert on.varlen and not on.lpt and not on.deterministic
    assert on.head_loop == plan.resolve(_call(varlen=False), 132).bwd.head_loop
    assert not plan.resolve(_call(), 132, {"bwd.head_loop": False}).bwd.head_loop
    assert plan.resolve(_call(), 1, {}).bwd.head_loop            # one SM: the grid fills
    assert not plan.resolve(_call(varlen=False), 132).bwd.varlen
    assert plan.resolve(_call("sigmoid", sigmoid_bias=None), 132).bwd.varlen
    det = plan.resolve(_call(deterministic=True), 132).bwd
    assert not det.varlen and det.deterministic
    with pytest.raises(ValueError, match="runs packed calls"):
        plan.resolve(_call(varlen=False), 132, {"bwd.varlen": True})
    with pytest.raises(ValueError, match="not deterministic"):
        plan.resolve(_call(deterministic=True), 132, {"bwd.varlen": True})
    # the per-KV-head loop by override too, never the pre kernel's dQ zeroing (backward_varlen's memset)
    hl = plan.resolve(_call(), 132, {"bwd.head_loop": True})
    assert hl.bwd.varlen and hl.bwd.head_loop and not hl.bwd.lpt and not hl.zero_dq_in_pre
    with pytest.raises(ValueError, match="bwd.zero_dq_in_pre: packed calls zero the dQ accumulator by a memset"):
        plan.resolve(_call(), 132, {"bwd.head_loop": True, "bwd.zero_dq_in_pre": True})


def test_check_bwd_refuses_what_the_varlen_build_lacks():
    from flash_attn_poly import plan
    from flash_attn_poly.kernels.config import check_bwd
    cfg = plan.resolve(_call(), 132, {"bwd.head_loop": False}).bwd
    check_bwd(cfg)
    for field in ("lpt", "deterministic"):
        with pytest.raises(ValueError, match=f"varlen backward: .*{field}=True"):
            # deterministic builds add dQ from the MMA threads: no staged tile, so no halves either
            staged_off = {"dq_async": False, "dq_halves": False} if field == "deterministic" else {}
            check_bwd(dataclasses.replace(cfg, **{field: True}, **staged_off))
    check_bwd(dataclasses.replace(cfg, head_loop=True))   # the per-KV-head loop builds for packed calls too


@pytest.mark.parametrize("order", ["unit", "block"])
def test_backward_varlen_launch_contract(monkeypatch, order):
    """kernels/dispatch.backward_varlen on CPU tensors with the compiled kernels stood in by
    recorders: the pre kernel gets packed (1, total, H, D) / (1, H, total) views, the offsets and
    max_seqlen_q, and its oracle's rows reach the main kernel; the main kernel gets exactly the
    arguments of AttnBwdSm90Varlen.__call__ (count and order: the padded buffers, the (1, total,
    H, D) dK / dV accumulators, the padded (1, H, rows, D) dQ accumulator, the offsets, the CTA
    table in the plan's order (bwd.varlen_order) and its grid, the numbers, the window); the post
    kernels' outputs come back as packed (total, H, D) gradients (dQ read per sequence from its
    padded offset)."""
    import inspect

    pytest.importorskip("cutlass")
    from flash_attn_poly import plan
    from flash_attn_poly.kernels import attn_bwd_sm90, compile_cache, dispatch
    lengths_q, lengths_k = [5, 0, 130, 1], [7, 2, 129, 0]
    cu_q_l, cu_k_l = _cu(lengths_q), _cu(lengths_k)
    h_q, h_kv, d = 4, 2, 64
    g = torch.Generator().manual_seed(1)
    q, dout, out = (torch.randn(cu_q_l[-1], h_q, d, generator=g).bfloat16() for _ in range(3))
    k, v = (torch.randn(cu_k_l[-1], h_kv, d, generator=g).bfloat16() for _ in range(2))
    lse = torch.randn(h_q, cu_q_l[-1], generator=g)
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32) for c in (cu_q_l, cu_k_l))
    call = plan.AttnCall(mode="softmax", evaluator="native", dtype="bf16", head_dim=d, batch=4, seqlen_q=130,
                         seqlen_k=129, heads_q=h_q, heads_kv=h_kv, causal=True, window=(-1, -1),
                         softmax_scale=0.125, varlen=True)
    vp = plan.resolve(call, 132, {"bwd.varlen": True, "bwd.varlen_order": order})
    calls = {}

    def compiled(kind, key, build):
        def fn(*args):
            calls.setdefault(kind, []).append((key, args))
            if kind == "attn_bwd_prepost" and not hasattr(key, "needs_lse") and key.part == "dq":   # post dQ
                dq_acc, dq4, cu, max_q, scale = args
                assert key.varlen and cu is cu_q and max_q == 130
                dq4[0].copy_(ref.postprocess_dq_varlen(dq_acc, scale, dq4.dtype, cu_q_l))
            elif kind == "attn_bwd_prepost" and not hasattr(key, "needs_lse"):   # post dK, dV
                dk_acc, dv_acc, dk, dv, scale = args
                dk.copy_(dk_acc * scale), dv.copy_(dv_acc)
            elif kind == "attn_bwd_prepost":                                    # pre: the oracle
                do4, o4, lse3, lse2, dsum, cu, max_q = args
                assert key.varlen and do4.shape == (1,) + tuple(q.shape) and lse3.shape == (1,) + tuple(lse.shape)
                assert cu is cu_q and max_q == 130
                r2, rd = ref.preprocess_varlen(do4[0], o4[0], lse3[0], cu_q_l, True, True)
                rows = ref.varlen_owned_rows(cu_q_l)
                lse2[:, :, rows], dsum[:, :, rows] = r2[:, :, rows], rd[:, :, rows]
            else:                                                               # main: mark the accumulators
                args[6].fill_(float("nan"))                                     # padding: never read
                idx = dq_acc_index(args[6].shape[2], d)
                for b in range(len(cu_q_l) - 1):   # each sequence's rows of the dQ accumulator
                    p = varlen_padded_offset(cu_q_l[b], b)   # a whole band: its words are p * D + ...
                    args[6].view(1, args[6].shape[1], -1)[..., p * d + idx[:cu_q_l[b + 1] - cu_q_l[b]].reshape(-1)] = 1.0
                args[7].fill_(2.0), args[8].fill_(3.0)
        return fn

    monkeypatch.setattr(compile_cache, "compiled", compiled)
    dq, dk, dv = dispatch.backward_varlen(vp, dout, q, k, v, out, lse, cu_q, cu_k, 130, 129)
    (key, args), = calls["attn_bwd"]
    assert key == vp.bwd and key.varlen
    params = [p for p in inspect.signature(attn_bwd_sm90.AttnBwdSm90Varlen.__call__).parameters if p not in ("self", "stream")]
    assert len(args) == len(params), (len(args), params)
    named = dict(zip(params, args))
    assert named["mQ"].shape == (1,) + tuple(q.shape) and named["mK"].shape == (1,) + tuple(k.shape)
    assert named["mdO"].shape == (1,) + tuple(dout.shape)
    rows = varlen_padded_rows(cu_q_l[-1], 4)
    assert named["mLSE"].shape == named["mDsum"].shape == (1, h_q, rows)
    owned = ref.varlen_owned_rows(cu_q_l)
    r2, rd = ref.preprocess_varlen(dout, out, lse, cu_q_l, True, True)
    torch.testing.assert_close(named["mLSE"][:, :, owned], r2[:, :, owned])
    torch.testing.assert_close(named["mDsum"][:, :, owned], rd[:, :, owned])
    assert named["mdQacc"].shape == (1, h_q, rows, d) and named["mdQacc"].dtype == torch.float32
    assert named["mdKacc"].shape == named["mdVacc"].shape == (1,) + tuple(k.shape)
    assert named["mCuSeqlensQ"] is cu_q and named["mCuSeqlensK"] is cu_k
    # the CTA table of the live (key block, head, sequence) triples and the grid's host bound
    from flash_attn_poly.kernels import tile_scheduler as T
    assert vp.varlen_bwd_order == order
    section = T.varlen_bwd_section(order, vp.bwd.head_loop, h_q, 130, d)
    assert torch.equal(named["mTable"], T.varlen_bwd_table(cu_k, 129, vp.bwd.tile_n, h_q, cu_k_l[-1], section))
    assert int(named["mTable"][0]) == (1 + 1 + 2 + 0) * h_q <= named["n_ctas"] == (138 // 128 + 4) * h_q
    assert (named["scale"], named["softcap"], named["bias"]) == (0.125, 0.0, 0.0)
    assert (named["win_left"], named["win_right"]) == vp.window
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and dq.dtype == torch.bfloat16
    assert (dq == 0.125).all() and (dk == 0.25).all() and (dv == 3.0).all()
