"""NaN and Inf inputs (issue 26, item 5), on both backends: the semantics attention()'s docstring
states.  The formula in IEEE arithmetic, as torch's own attention math: a NaN in q, k or v makes
the output rows that see it NaN (and their LSE, and the gradients it reaches), never zero or
finite rows; an Inf gives what the formula gives (a +Inf score makes its softmax row NaN;
softcap's tanh and sigmoid saturate to finite values; an Inf in v reaches O as +-Inf).  Rows and
(batch, head) slices that do not see the poisoned element are untouched: bitwise the clean
run's output; a row that sees no key stays zero with LSE -inf.  Not stated: rows of the poisoned
slice that do not see a poisoned v (P = 0 times NaN is NaN, as in torch), and which gradient
entries outside the rows/keys that see the element turn NaN (dQ = dS K multiplies a zero dS by
a NaN key, as torch's autograd does).

The reference backend runs on the CPU; the CUDA backend (marked gpu) must state the same."""
import pytest
import torch

import flash_attn_poly
from flash_attn_poly.reference import causal_mask

SHAPES = {   # (B, S_q, S_k, H_q, H_kv), causal bottom-right
    "sq<sk": (2, 130, 200, 4, 2),
    "sq>sk": (2, 200, 130, 4, 2),   # query rows 0..69 see no key
}
B0, H0, G0 = 1, 3, 1          # the poisoned batch, query head, and its kv head (H_q / H_kv = 2)
HEADS0 = [2, 3]               # the query heads that read kv head G0
COL = 7                       # the poisoned column of v
POISONS = ["q-nan", "k-nan", "v-nan", "q-inf", "k-inf", "v-inf"]
SOFTCAP = 50.0   # Gemma-2's cap
_REF_MODES = [("softmax", "native"), ("softcap", "native"), ("sigmoid", "native")]   # evaluator ignored
_CUDA_MODES = [("softmax", "native"), ("softcap", "native"), ("softcap", "poly"), ("sigmoid", "native"),
               ("sigmoid", "poly")]
RUNS = ([pytest.param("reference", m, e, torch.bfloat16, 64, id=f"reference-{m}") for m, e in _REF_MODES]
        + [pytest.param("cuda", m, e, torch.bfloat16, 128, marks=pytest.mark.gpu, id=f"cuda-{m}-{e}-bf16")
           for m, e in _CUDA_MODES]
        # FP16 inputs take the FP16 tanh program (softcap) and the FP16 sigmoid program
        + [pytest.param("cuda", m, "poly", torch.float16, 128, marks=pytest.mark.gpu, id=f"cuda-{m}-poly-fp16")
           for m in ("softcap", "sigmoid")])


def _inputs(shape, d, dtype, device, seed=0):
    b, s_q, s_k, h_q, h_kv = shape
    g = torch.Generator().manual_seed(seed)
    mk = lambda s, h: torch.randn(b, s, h, d, generator=g).to(dtype).to(device)
    return mk(s_q, h_q), mk(s_k, h_kv), mk(s_k, h_kv)


def _poison(q, k, v, kind):
    """(clean, poisoned, i0, j0): the inputs the clean run takes, the same with one element
    made NaN or Inf, and the query row and key it sits in.  The Inf cases make the scores of the
    rows that see it exactly +inf: q (k) holds a single +inf in column 0 of a row zero elsewhere
    (1 in the clean run), and the other operand's column 0 is > 0 (in both runs)."""
    q, k, v = q.clone(), k.clone(), v.clone()
    i0, j0 = q.shape[1] - 1, k.shape[1] // 2
    if kind == "q-inf":
        q[B0, i0, H0] = 0
        q[B0, i0, H0, 0] = 1
        k[B0, :, G0, 0] = k[B0, :, G0, 0].abs() + 0.25
    elif kind == "k-inf":
        k[B0, j0, G0] = 0
        k[B0, j0, G0, 0] = 1
        q[B0, :, HEADS0, 0] = q[B0, :, HEADS0, 0].abs() + 0.25
    clean = (q, k, v)
    q, k, v = (t.clone() for t in clean)
    where = {"q": (q, (B0, i0, H0, 5)), "k": (k, (B0, j0, G0, 5)), "v": (v, (B0, j0, G0, COL))}
    t, idx = where[kind[0]]
    if kind.endswith("inf"):
        idx = idx[:3] + ((COL if kind[0] == "v" else 0),)
    t[idx] = float("nan") if kind.endswith("nan") else float("inf")
    return clean, (q, k, v), i0, j0


def _touched(kind, shape, i0, j0):
    """(B, S_q, H_q) bool: the output rows that see the poisoned element."""
    b, s_q, s_k, h_q, _ = shape
    sees = causal_mask(s_q, s_k)
    t = torch.zeros(b, s_q, h_q, dtype=torch.bool)
    if kind.startswith("q"):
        t[B0, i0, H0] = bool(sees[i0].any())
    else:
        t[B0, :, HEADS0] = sees[:, j0, None]
    return t


def _saturates(kind, mode):
    """An Inf score under tanh or sigmoid: a finite result, as in torch."""
    return kind in ("q-inf", "k-inf") and mode in ("softcap", "sigmoid")


def _kw(mode):
    return {"softcap": SOFTCAP} if mode == "softcap" else {}


def _run(q, k, v, mode, evaluator, backend, grad=False, dout=None):
    qg, kg, vg = (t.clone().requires_grad_(grad) for t in (q, k, v))
    lse_ok = mode != "sigmoid"
    res = flash_attn_poly.attention(qg, kg, vg, mode, evaluator=evaluator, backend=backend,
                                    return_lse=lse_ok, **_kw(mode))
    out, lse = res if lse_ok else (res, None)
    grads = torch.autograd.grad(out, (qg, kg, vg), dout) if grad else None
    return out.detach().cpu(), None if lse is None else lse.cpu(), grads and [g.cpu() for g in grads]


def _device(backend):
    return "cuda" if backend == "cuda" else "cpu"


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", POISONS)
@pytest.mark.parametrize("backend, mode, evaluator, dtype, d", RUNS)
def test_forward(backend, mode, evaluator, dtype, d, kind, shape):
    shp = SHAPES[shape]
    (q, k, v), (qp, kp, vp), i0, j0 = _poison(*_inputs(shp, d, dtype, _device(backend)), kind)
    clean, clean_lse, _ = _run(q, k, v, mode, evaluator, backend)
    out, lse, _ = _run(qp, kp, vp, mode, evaluator, backend)
    touched = _touched(kind, shp, i0, j0)
    assert touched.any()
    bad = ~torch.isfinite(out)

    # the rows that see it
    rows = out[touched]                                              # (n, D)
    if _saturates(kind, mode):
        ref, _, _ = _run(qp.cpu(), kp.cpu(), vp.cpu(), mode, evaluator, "reference")
        want = ref[touched].float()
        assert torch.isfinite(want).all() and torch.isfinite(rows).all(), f"{kind}: saturating rows not finite"
        tol = 2e-2 * want.abs().max().item() + 1e-2
        assert (rows.float() - want).abs().max() <= tol, f"{kind}: saturated rows off the reference"
    elif kind.startswith("v"):
        assert (~torch.isfinite(rows[:, COL])).all(), f"{kind}: a row that sees v's {kind} stayed finite"
        others = torch.ones(rows.shape[1], dtype=torch.bool)
        others[COL] = False
        assert torch.isfinite(rows[:, others]).all(), f"{kind} leaked into other columns"
        if kind == "v-nan":
            assert rows[:, COL].isnan().all()
    else:
        assert rows.isnan().all(), f"{kind}: {int((~rows.isnan()).sum())} entries of rows that see it are not NaN"

    # what does not see it: the clean run's output, bit for bit
    same_slice = torch.zeros_like(touched)
    if kind.startswith("q"):
        same_slice[B0, :, H0] = True
    else:
        same_slice[B0, :, HEADS0] = True
    untouched = ~same_slice if kind.startswith("v") else ~touched   # v: rows of its slice unstated
    assert torch.equal(out[untouched], clean[untouched]), \
        f"{kind}: {int(bad[untouched].any(-1).sum())} rows that do not see it changed"

    # rows that see no key: zero, LSE -inf (their O is unstated where v is poisoned)
    empty = ~causal_mask(shp[1], shp[2]).any(-1)
    if empty.any():
        if not kind.startswith("v"):
            assert (out[:, empty] == 0).all()
        if lse is not None:
            assert (lse[:, :, empty] == -float("inf")).all()

    if lse is not None:   # (B, H_q, S_q)
        lse_t = lse.transpose(1, 2)[touched]
        if kind.startswith("v"):
            assert torch.equal(lse, clean_lse), "v does not enter the LSE"
        elif _saturates(kind, mode):
            assert torch.isfinite(lse_t).all()
        else:
            assert (~torch.isfinite(lse_t)).all(), f"{kind}: LSE of rows that see it is finite"
        lu = lse.transpose(1, 2)[untouched]
        assert torch.equal(lu, clean_lse.transpose(1, 2)[untouched])


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", ["q-nan", "k-nan", "v-nan"])
@pytest.mark.parametrize("backend, mode, evaluator, dtype, d", RUNS)
def test_backward(backend, mode, evaluator, dtype, d, kind, shape):
    """A NaN reaches the gradients of the rows and keys that see it; the (batch, kv head) slices
    that do not hold it get the clean run's gradients (within the backward's FP32 atomics)."""
    shp = SHAPES[shape]
    dev = _device(backend)
    (q, k, v), (qp, kp, vp), i0, j0 = _poison(*_inputs(shp, d, dtype, dev), kind)
    dout = _inputs(shp, d, dtype, dev, seed=1)[0]
    _, _, (cq, ck, cv) = _run(q, k, v, mode, evaluator, backend, grad=True, dout=dout)
    _, _, (dq, dk, dv) = _run(qp, kp, vp, mode, evaluator, backend, grad=True, dout=dout)
    sees = causal_mask(shp[1], shp[2])
    nan_rows = lambda t: (~torch.isfinite(t)).all(-1)
    if kind == "q-nan":
        assert nan_rows(dq[B0, i0, H0])
        assert nan_rows(dk[B0, sees[i0], G0]).all() and nan_rows(dv[B0, sees[i0], G0]).all()
    else:
        rows = sees[:, j0]
        assert nan_rows(dq[B0][rows][:, HEADS0]).all(), f"{kind}: dQ of rows that see it finite"
        assert nan_rows(dk[B0, j0, G0]), f"{kind}: dK of the key finite"
        if kind == "k-nan":
            assert nan_rows(dv[B0, j0, G0])
        else:   # dV = P^T dO does not read v
            assert torch.isfinite(dv).all(), "a NaN in v reached dV"
    # the other batch and the other kv head of the poisoned batch: untouched
    for got, want, heads in ((dq, cq, [0, 1]), (dk, ck, [1 - G0]), (dv, cv, [1 - G0])):
        for sl in (got[0], got[B0][:, heads]):
            assert torch.isfinite(sl).all()
        torch.testing.assert_close(got[0], want[0], atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(got[B0][:, heads], want[B0][:, heads], atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("j0", [60, 124])
def test_forward_nan_key_in_exp2_offload_column(j0):
    """The exp2 offload (softcap poly, BF16, cap <= 50) computes P = 2^a on the FMA pipe for the
    key columns c with (c // 8) % 8 >= 8 - exp2_fma of mask-free blocks.  Its block adds the
    integer exponent to the polynomial's bits, so a NaN a (a NaN key) leaves there not a NaN but
    FLT_MAX (the FP32 ops' canonical NaN 0x7FFFFFFF times 2^23 plus itself wraps to 0x7F7FFFFF:
    tests/test_asm_emulator.py's canonical-NaN case), +inf once rounded to BF16.  O must be NaN all the same (+inf over the
    rounded-P sum +inf) and the LSE non-finite, as attention() states; rows that do not see the key
    keep their bits.  A key on
    such a column in block 0: mask-free for the query tiles past the first."""
    from flash_attn_poly import interface, plan as plan_mod
    shp = (2, 512, 512, 4, 2)
    q, k, v = _inputs(shp, 128, torch.bfloat16, "cuda")
    call = interface.validate(q, k, v, "softcap", "poly", True, SOFTCAP, None, None, (-1, -1))
    fwd = plan_mod.resolve(call, torch.cuda.get_device_properties(0).multi_processor_count).fwd
    assert fwd.exp2_fma > 0 and ((j0 % fwd.tile_n) // 8) % 8 >= 8 - fwd.exp2_fma, fwd
    kp = k.clone()
    kp[B0, j0, G0, 5] = float("nan")
    clean, clean_lse, _ = _run(q, k, v, "softcap", "poly", "cuda")
    out, lse, _ = _run(q, kp, v, "softcap", "poly", "cuda")
    touched = torch.zeros(2, 512, 4, dtype=torch.bool)
    touched[B0, j0:, HEADS0] = True
    assert out[touched].isnan().all(), f"{int((~out[touched].isnan()).sum())} entries of rows that see it are not NaN"
    assert (~torch.isfinite(lse.transpose(1, 2)[touched])).all()
    assert torch.equal(out[~touched], clean[~touched])
    assert torch.equal(lse.transpose(1, 2)[~touched], clean_lse.transpose(1, 2)[~touched])
