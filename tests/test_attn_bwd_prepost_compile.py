"""Compile tier: the backward's CuTe pre/post kernels (kernels/attn_bwd_prepost_sm90.py)
build for sm_90a on the CPU; SASS: 128-bit global loads where expected, no spills.
CPU tier: the entries' input checks against the torch reference (kernels/attn_bwd_prepost.py)."""
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
        k = P.PreKernel(key) if isinstance(key, P.PreKey) else P.PostKernel(key)
        c = sass.compile_sm90(k, *k.fake_args(), cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=False))
        regs = sass.registers(c.artifacts.CUBIN)
        assert len(regs) == 1, regs
        _BUILT[key] = sass.count_opcodes(sass.disassemble(c.artifacts.CUBIN)), next(iter(regs.values()))
    return _BUILT[key]


@pytest.mark.compile
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("base", ["e", "2"])
def test_pre_sass(dtype, d, base):
    c, regs = _build(P.PreKey(dtype, d, True, True, base))
    # one row per D/32 lanes, 4 chunks of dO and 4 of O per lane: 8 x 16-byte loads
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
    c, regs = _build(P.PostKey(dtype))
    # 3 gradient segments x UNROLL chunks: 2 x LDG.E.128 in (8 FP32), 1 x STG.E.128 out
    assert c["LDG.E.128"] == 3 * 2 * P.POST_UNROLL, c
    assert c["STG.E.128"] == 3 * P.POST_UNROLL, c
    assert c["F2FP"] == 3 * P.POST_UNROLL * 4, c     # 4 packed cvt.rn per chunk
    assert c["STL"] == 0 and c["LDL"] == 0, c
    assert regs <= 64, regs          # measured 48


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
        pre_zero(x, x, st, st, st, torch.zeros(1, 256, 4, 128))
    post = L.get_compiled(P.PostKey("bf16"))
    acc = torch.zeros(1, 256, 4, 128)
    with pytest.raises(Exception, match="device_type=cuda"):
        post(acc, acc, acc, x, x, x, 0.125)


@pytest.mark.compile
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("flags", [(True, True), (False, False)], ids=str)
def test_pre_zero_dq_sass(d, flags):
    """PreZeroKernel: the pre kernel's loads plus 8 x 16-byte zero stores per thread
    (D / 4 chunks per row over D / 32 lanes), no spills."""
    import cutlass.cute as cute
    key = P.PreKey("bf16", d, *flags, zero_dq=True)
    k = P.PreZeroKernel(key)
    c = sass.compile_sm90(k, *k.fake_args(), cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=False))
    n = sass.count_opcodes(sass.disassemble(c.artifacts.CUBIN))
    assert n["STG.E.128"] == d // P.ZERO_CHUNK // k.lanes == 8, n
    assert n["LDG.E.128"] == (2 * P.PRE_CHUNKS if flags[1] else 0), n
    assert n["STL"] == 0 and n["LDL"] == 0, n


def test_preprocess_dq_acc_contract():
    """The torch reference zeroes dq_acc; the CuTe entry refuses a wrong dq_acc by name
    before launching anything (CPU tensors: the check comes first)."""
    torch = pytest.importorskip("torch")
    from flash_attn_poly.kernels import attn_bwd_prepost as ref
    do = torch.randn(1, 5, 2, 64, dtype=torch.bfloat16)
    acc = torch.full(do.shape, float("nan"))
    lse2, dsum = ref.preprocess(do, do, None, False, False, "e", 128, dq_acc=acc)
    assert torch.equal(acc, torch.zeros_like(acc)) and torch.equal(lse2, torch.zeros(1, 2, 128))
    with pytest.raises(ValueError, match="dq_acc must be FP32 shaped like dout"):
        L.preprocess(do, do, None, False, False, "e", 128, dq_acc=torch.zeros(1, 5, 2, 32))
    with pytest.raises(ValueError, match="dq_acc must be FP32"):
        L.preprocess(do, do, None, False, False, "e", 128, dq_acc=torch.zeros(do.shape, dtype=torch.bfloat16))
