"""CPU tier of bench/train_model.py: the dry run (tiny configs, reference backend, 3 steps per
arm), the arm switch under torch.compile, and the memory plan on the meta device."""
import json
import math
import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import train_model as tm  # noqa: E402


def test_dry_run_writes_rows_for_every_model(tmp_path):
    js = tmp_path / "t.json"
    assert tm.main(["--dry-run", "--json", str(js)]) == 0
    out = json.loads(js.read_text())
    rows = {(r["model"], r["arm"]): r for r in out["rows"]}
    for model, (_, _, arms) in tm.MODELS.items():
        for arm in arms:
            r = rows[(model, arm)]
            if arm == "flex":                       # no CPU backward: a skipped row saying so
                assert "CPU backward" in r["skipped"]
                continue
            assert r["steps"] == 3 and r["timed_steps"] == 2, r
            assert math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0
            assert math.isfinite(r["loss_last"]) and abs(r["loss_last"] - math.log(97)) < 1.0
            assert r["step_ms"] >= r["fwd_ms"] and r["mlp"] == {"native": "native", "poly": "poly"}.get(arm, "torch")
            assert set(r["profile_ms_per_step"]) <= {c for c, _ in tm.PROFILE_CATEGORIES} | {"other"}
            assert r["profile_ms_per_step"]["matmul"] > 0
            top = r["profile_top_kernels"]
            assert 0 < len(top) and [k["ms"] for k in top] == sorted((k["ms"] for k in top), reverse=True)
            assert all(k["ms"] >= tm.PROFILE_FLOOR_MS for k in top[tm.PROFILE_TOP:])
            assert sum(k["ms"] for k in top) <= sum(r["profile_ms_per_step"].values()) + 1e-6
    md = (tmp_path / "t.md").read_text()
    assert md.count("| gemma2-2b |") == 6     # timing and profile rows
    assert "Kernels, gemma2-2b S=" in md   # the arms' per-kernel diff


def test_profile_categories_of_kernel_names():
    """Our CuTe kernels carry "flash_attn_poly" in every name: that must not make them attention."""
    names = {"kernel_cutlass_kernel_flash_attn_polykernelselementwiseElementwiseKernel_object_at_": "mlp activation",
             "kernel_cutlass_kernel_flash_attn_polykernelsattn_bwd_sm90AttnBwdSm90_object_at": "attention",
             "triton_poi_fused_gelu_mul_0": "mlp activation", "triton_tem_fused_0": "attention",
             "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1": "norms",
             "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT": "matmul",
             "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, "
             "float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>": "loss",
             "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
             "triton_poi_fused_add_cat_mul_5": "other",
             "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
             "std::array<char*, 1ul> >": "elementwise (aten)",
             "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda": "elementwise (aten)"}
    for name, cat in names.items():
        assert tm.classify(name) == cat, name


def test_arms_the_models_cannot_run_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="sdpa does not compute softcap"):
        tm.attn_impl("softcap", "sdpa")
    with pytest.raises(ValueError, match="cannot express sigmoid"):
        tm.attn_impl("sigmoid", "flex")
    with pytest.raises(ValueError, match="mlp must be one of"):
        tm.parse_arm("poly:gelu")
    assert tm.parse_arm("flex") == ("flex", "torch") and tm.parse_arm("poly") == ("poly", "poly")
    assert tm.parse_arm("native:poly") == ("native", "poly")


def test_arm_switch_under_compile_keeps_one_graph_per_arm():
    """The arms share one compiled model: switching the attention implementation (and back) must
    change what runs, not replay the first arm's graph."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    tm.register_attention("reference")

    def zero_attention(module, q, k, v, mask, **kw):
        return torch.zeros_like(q).transpose(1, 2).contiguous(), None
    AttentionInterface.register("zero_attention", zero_attention)
    AttentionMaskInterface.register("zero_attention", flash_attention_mask)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tm.llama3_config(2, tiny=True),
                                                          attn_implementation="poly_attention_native")
    # the GeGLU kernel path on a SwiGLU model: our MLP computes another function than the
    # model's own, so the MLP switch is visible in the loss too
    mlps = tm.wrap_mlps(model, "gemma2", "reference")
    torch._dynamo.config.recompile_limit = 64
    for layer in model.model.layers:
        layer.compile(backend="aot_eager", dynamic=False)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))

    def loss(impl, mlp="torch"):
        tm.set_arm(model, mlps, impl, mlp)
        with torch.no_grad():
            return model(input_ids=ids, labels=ids, use_cache=False).loss.item()
    ours = loss("poly_attention_native")
    zero = loss("zero_attention")
    assert zero != ours
    assert loss("poly_attention_native") == ours
    assert abs(loss("sdpa") - ours) < 1e-5                 # the same math, another implementation
    gelu = loss("poly_attention_native", "poly")
    assert gelu != ours
    assert loss("poly_attention_native", "torch") == ours and loss("poly_attention_poly", "native") == gelu


def test_memory_plan_llama_layers_fit_and_one_more_does_not():
    n, p = tm.max_layers(4096, 4, tm.H200_GIB)
    assert 4 <= n <= 20 and p["fits"] and p["layers"] == n
    assert not tm.plan("llama3-8b", 4096, 4, n + 1)["fits"]
    assert p["params_b"] > 0.218 * n                         # 218 M parameters per layer
