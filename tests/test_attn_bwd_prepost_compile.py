"""Compile tier: the backward's CuTe pre/post kernels (kernels/attn_bwd_prepost_sm90.py)
build for sm_90a on the CPU; SASS: 128-bit global loads where expected, no spills.
CPU tier: the entries' input checks against the torch reference (kernels/attn_bwd_prepost.py)."""
import re

import pytest

pytest.importorskip("cutlass")

from flash_attn_poly.kernels import attn_bwd_prepost_sm90 as P  # noqa: E402
from flash_attn_poly.kernels import prepost_launch as L  # noqa: E402
from flash_attn_poly.kernels import sass  # noqa: E402

_BUILT = {}


def _build(key):
    """(opcode family counts, registers of the one kernel) for a PreKey/PostKey."""
    if key not in _BUILT:
        import cutlass.cute as cute
        k = P.kernel_for(key) if isinstance(key, P.PostKey) else P.PreKernel(key)
        c = sass.compile_sm90(k, *k.fake_args(), cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=False))
        regs = sass.registers(c.artifacts.CUBIN)
        assert len(regs) == 1, regs
        text = sass.disassemble(c.artifacts.CUBIN)
        counts = dict(sass.count_opcodes(text), **{op: len(re.findall(rf"\b{op}\b", text)) for op in ("STS.128", "LDS.128")})
        _BUILT[key] = counts, next(iter(regs.values()))
    return _BUILT[key]


@pytest.mark.compile
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("base", ["e", "2"])
def test_pre_sass(dtype, d, base):
    c, regs = _build(P.PreKey(dtype, d, True, True, base))
    # one row per D/8 lanes, one chunk of dO and of O per lane and pass, 4 passes: 8 x 16-byte loads
    assert c["LDG.E.128"] == 2 * P.PRE_CHUNKS, c
    assert c["STL"] == 0 and c["LDL"] == 0, c
    assert c["MUFU"] == 0, c
    assert regs <= 64, regs          # measured 34


@pytest.mark.compile
@pytest.mark.parametrize("needs_lse,needs_dsum", [(True, False), (False, True)])
def test_pre_stage_flags(needs_lse, needs_dsum):
    c, _ = _build(P.PreKey("bf16", 128, needs_lse, needs_dsum))
    # without dsum the row loads are compiled out (the kernel writes zeros)
    assert c["LDG.E.128"] == (2 * P.PRE_CHUNKS if needs_dsum else 0), c
    assert c["STL"] == 0 and c["LDL"] == 0, c


@pytest.mark.compile
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_post_sass(dtype):
    c, regs = _build(P.PostKey(dtype, "dkv"))
    # 2 gradient segments x UNROLL chunks: 2 x LDG.E.128 in (8 FP32), 1 x STG.E.128 out
    assert c["LDG.E.128"] == 2 * 2 * P.POST_UNROLL, c
    assert c["STG.E.128"] == 2 * P.POST_UNROLL, c
    assert c["F2FP"] == 2 * P.POST_UNROLL * 4, c     # 4 packed cvt.rn per chunk
    assert c["STL"] == 0 and c["LDL"] == 0, c
    assert regs <= 64, regs          # measured 48


@pytest.mark.compile
@pytest.mark.parametrize("varlen", [False, True])
def test_post_dq_sass(varlen):
    """PostDqKernel: per warp item DQ_STEPS warp-wide 16-byte loads, as many 16-byte smem stores
    and loads (the XOR-placed chunks), 2 x STG.E.128 (one chunk per row r, r + 8), no spills."""
    c, regs = _build(P.PostKey("bf16", "dq", varlen))
    n = P.POST_DQ_ITEMS * P.DQ_STEPS
    assert c["LDG.E.128"] == n and c["LDG.E.64"] == 0, c
    assert c["STS.128"] == n and c["LDS.128"] == n, c
    assert c["STG.E.128"] == 2 * P.POST_DQ_ITEMS, c
    assert c["F2FP"] == 2 * P.POST_DQ_ITEMS * 4, c
    assert c["STL"] == 0 and c["LDL"] == 0, c
    assert regs <= 64, regs


def test_post_key_refuses():
    with pytest.raises(ValueError, match="unsupported"):
        L.PostKey("bf16", "dkv", varlen=True)
    with pytest.raises(ValueError, match="unsupported"):
        L.PostKey("bf16", "dk")


@pytest.mark.compile
def test_tvm_ffi_signatures():
    """The tvm-ffi builds take torch tensors (+ a Python float): with CPU tensors the call
    gets as far as the device check of argument 0 (no CUDA here)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("tvm_ffi")
    pre = L.get_compiled(P.PreKey("bf16", 128, True, True))
    x, st = torch.zeros(1, 256, 4, 128, dtype=torch.bfloat16), torch.zeros(1, 4, 256)
    with pytest.raises(Exception, match="device_type=cuda"):
        pre(x, x, st, st, st)
    pre_zero = L.get_compiled(P.PreKey("bf16", 128, True, True, zero_dq=True))
    with pytest.raises(Exception, match="device_type=cuda"):
        pre_zero(x, x, st, st, st, torch.zeros(1, 4, 256, 136))
    post = L.get_compiled(P.PostKey("bf16", "dkv"))
    acc = torch.zeros(1, 256, 4, 128)
    with pytest.raises(Exception, match="device_type=cuda"):
        post(acc, acc, x, x, 0.125)
    post_dq = L.get_compiled(P.PostKey("bf16"))
    with pytest.raises(Exception, match="device_type=cuda"):
        post_dq(torch.zeros(1, 4, 256, 136), x, 0.125)


@pytest.mark.compile
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("flags", [(True, True), (False, False)], ids=str)
def test_pre_zero_dq_sass(d, flags):
    """PreZeroKernel: the pre kernel's loads plus 8 x 16-byte zero stores per thread (the
    CTA's rows x D words, 1024 chunks over 128 threads), no spills."""
    import cutlass.cute as cute
    key = P.PreKey("bf16", d, *flags, zero_dq=True)
    k = P.PreZeroKernel(key)
    c = sass.compile_sm90(k, *k.fake_args(), cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=False))
    n = sass.count_opcodes(sass.disassemble(c.artifacts.CUBIN))
    assert n["STG.E.128"] == k.rows * d // P.ZERO_CHUNK // P.PRE_THREADS == 8, n
    assert n["LDG.E.128"] == (2 * P.PRE_CHUNKS if flags[1] else 0), n
    assert n["STL"] == 0 and n["LDL"] == 0, n


def test_preprocess_dq_acc_contract():
    """The torch reference zeroes dq_acc; the CuTe entries refuse a wrong dq_acc by name
    before launching anything (CPU tensors: the check comes first)."""
    torch = pytest.importorskip("torch")
    from flash_attn_poly.kernels import attn_bwd_prepost as ref
    do = torch.randn(1, 5, 2, 64, dtype=torch.bfloat16)
    assert L.dq_acc_shape(1, 5, 2, 64) == (1, 2, 128, 64)
    acc = torch.full(L.dq_acc_shape(1, 5, 2, 64), float("nan"))
    lse2, dsum = ref.preprocess(do, do, None, False, False, "e", 128, dq_acc=acc)
    assert torch.equal(acc, torch.zeros_like(acc)) and torch.equal(lse2, torch.zeros(1, 2, 128))
    with pytest.raises(ValueError, match=r"dq_acc must be FP32 \(1, 2, 128, 64\) \(the dQ accumulator"):
        L.preprocess(do, do, None, False, False, "e", 128, dq_acc=torch.zeros(do.shape))
    with pytest.raises(ValueError, match="dq_acc must be FP32"):
        L.preprocess(do, do, None, False, False, "e", 128, dq_acc=torch.zeros(acc.shape, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"dq_acc must be FP32 \(1, 2, 128, 64\) for S_q = 5"):
        L.postprocess_dq(torch.zeros(1, 2, 256, 64), 1.0, torch.bfloat16, 5)
    with pytest.raises(ValueError, match=r"dq_acc must be FP32 \(1, 2, 256, 64\)"):
        L.postprocess_dq_varlen(torch.zeros(1, 2, 128, 64), 1.0, torch.bfloat16,
                                torch.tensor([0, 3, 5], dtype=torch.int32), 3, 5)


def test_dq_acc_layout_reference():
    """dq_from_acc (the layout's torch reference): bands of 16 rows of one head, each in the wgmma
    fragment's order (a thread's (r, r + 8) x (c, c + 1) four adjacent words, a warp's 32 lanes of
    one 8-column step 128 adjacent words), so a query block of tile_m rows is one contiguous range;
    the round trip is exact; the reference post reads exactly dq_from_acc (padding rows and, for
    varlen, the gaps between sequences poisoned with NaN)."""
    torch = pytest.importorskip("torch")
    from flash_attn_poly.kernels import attn_bwd_prepost as ref
    d = 64
    w = L.dq_acc_word
    for r, c in ((0, 0), (5, 18), (16 + 3, 40), (32 + 7, 62)):     # rows r < 8 of a band, c even
        assert [w(r, c, d), w(r, c + 1, d), w(r + 8, c, d), w(r + 8, c + 1, d)] == [w(r, c, d) + i for i in range(4)]
    step = sorted(w(lane // 4 + 8 * h, 8 * 3 + 2 * (lane % 4) + e, d)
                  for lane in range(32) for h in (0, 1) for e in (0, 1))   # step j = 3 of band 0
    assert step == list(range(3 * 128, 4 * 128))
    assert w(40, 17, d) == 2 * 16 * 64 + 2 * 128 + 0 * 16 + 0 + 2 + 1   # band 2, step 2, lane 0, row + 8, col + 1
    assert torch.equal(L.dq_acc_index(128, d).view(-1).sort().values, torch.arange(128 * d))
    for dd in (64, 128, 256):   # the kernels' constant steps from a thread's first (row, col)
        for r0, c0 in ((0, 0), (7, 6), (16 + 5, 8 + 2), (64 + 3, 128 + 4)):
            for dr in (0, 8, 16, 24, 48, 56):
                for dc in (0, 8, 16, 56, 120):
                    if c0 + dc < dd:
                        assert w(r0 + dr, c0 + dc, dd) == w(r0, c0, dd) + L.dq_acc_step(dr, dc, dd), (dd, r0, c0, dr, dc)
    dq = torch.randn(2, 77, 3, d)
    acc = torch.zeros(L.dq_acc_shape(2, 77, 3, d))
    assert acc.shape == (2, 3, 128, d) and acc.is_contiguous()
    idx = L.dq_acc_index(128, d)
    acc.view(2, 3, -1)[..., idx[:77].reshape(-1)] = dq.transpose(1, 2).reshape(2, 3, -1)
    assert torch.equal(L.dq_from_acc(acc, 77), dq)
    # element (b, s, h, c) at word (b * H + h) * S_pad * D + dq_acc_word(s, c, D)
    assert acc.view(-1)[(1 * 3 + 2) * 128 * d + w(40, 17, d)] == dq[1, 40, 2, 17]
    acc.view(2, 3, -1)[..., idx[77:].reshape(-1)] = float("nan")
    out = ref.postprocess_dq(acc, 0.5, torch.bfloat16, 77)
    assert out.shape == dq.shape and torch.equal(out, (dq * 0.5).to(torch.bfloat16))
    # varlen: sequence b from its padded offset (a multiple of the band: p * D + the plane's words)
    cu = [0, 5, 5, 140]
    rows = L.varlen_padded_rows(140, 3)
    assert L.dq_acc_shape_varlen(140, 3, 3, d) == (1, 3, rows, d)
    dqv = torch.randn(140, 3, d)
    accv = torch.full(L.dq_acc_shape_varlen(140, 3, 3, d), float("nan"))
    idx = L.dq_acc_index(144, d)
    for b in range(3):
        p, n = L.varlen_padded_offset(cu[b], b), cu[b + 1] - cu[b]
        accv.view(3, -1)[:, p * d + idx[:n].reshape(-1)] = dqv[cu[b]:cu[b + 1]].transpose(0, 1).reshape(3, -1)
    got = ref.postprocess_dq_varlen(accv, 1.0, torch.float32, cu)
    assert torch.equal(got, dqv)
