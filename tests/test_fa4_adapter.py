"""flash_attn_poly.fa4: our softcap program as an FA4 score_mod pair.

Compile tier: the pair, inlined into a tiny kernel, builds for sm_90a and runs on the FMA
pipe (packed BF16 FMAs, no MUFU). GPU tier: FA4 with the pair matches the FP64 softcap
reference within the tolerance rule scaled for a polynomial (skipped without FA4)."""
import pytest

pytest.importorskip("cutlass")


@pytest.mark.compile
def test_score_mods_compile_without_mufu():
    import cutlass.cute as cute
    from cutlass import Float32
    from cutlass.cute.runtime import make_fake_compact_tensor

    from flash_attn_poly.fa4 import softcap_score_mods
    from flash_attn_poly.kernels import sass

    fwd, bwd = softcap_score_mods(50.0)
    assert fwd.__vec_size__ == 2

    @cute.kernel
    def kern(mX: cute.Tensor, mY: cute.Tensor):
        t = cute.arch.thread_idx()[0]
        r = cute.make_rmem_tensor((2,), Float32)
        r[0], r[1] = mX[2 * t], mX[2 * t + 1]
        g = bwd(fwd(r.load(), 0, 0, 0, 0, None, None), r.load(), 0, 0, 0, 0, None, None)
        r.store(g)
        mY[2 * t], mY[2 * t + 1] = r[0], r[1]

    @cute.jit
    def host(mX: cute.Tensor, mY: cute.Tensor):
        kern(mX, mY).launch(grid=(1, 1, 1), block=(32, 1, 1))

    x, y = (make_fake_compact_tensor(Float32, (64,)) for _ in range(2))
    counts = sass.count_opcodes(sass.sass_of(host, x, y))
    assert counts["MUFU"] == 0, counts
    assert counts["HFMA2.BF16"] >= 6, counts  # 3 Horner FMAs forward + 3 backward


def test_rejects_bad_softcap():
    from flash_attn_poly.fa4 import softcap_score_mods
    with pytest.raises(ValueError, match="softcap"):
        softcap_score_mods(0.0)


@pytest.mark.gpu
def test_fa4_with_poly_softcap_matches_reference():
    import torch
    fa4 = pytest.importorskip("flash_attn.cute")
    from flash_attn_poly.fa4 import softcap_score_mods
    from flash_attn_poly.reference import attention_ref
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 512, h, 128, device="cuda", dtype=torch.bfloat16) * s
               for h, s in ((8, 3.0), (2, 3.0), (2, 1.0)))
    fwd, bwd = softcap_score_mods(50.0)
    out = fa4.flash_attn_func(q, k, v, causal=True, score_mod=fwd, score_mod_bwd=bwd)
    out = out[0] if isinstance(out, tuple) else out
    ref, _ = attention_ref(q, k, v, "softcap", causal=True, softcap=50.0)
    native = fa4.flash_attn_func(q, k, v, causal=True, softcap=50.0)
    native = native[0] if isinstance(native, tuple) else native
    err, err_native = (out.double() - ref).abs().max().item(), (native.double() - ref).abs().max().item()
    print(f"FA4+poly softcap max err {err:.3e}, FA4 native softcap {err_native:.3e}")
    assert torch.isfinite(out).all()
    assert err < 4 * err_native + 2e-2
