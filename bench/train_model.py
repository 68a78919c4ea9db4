"""Model-level training step through transformers: tokens/s and peak memory per attention / MLP arm.

    python bench/train_model.py --model gemma2-2b --seqlen 4096         # H200: every arm the model allows
    python bench/train_model.py --model gemma2-2b --seqlen 8192 --arms flex,native,poly
    python bench/train_model.py --model llama3-8b --arms sdpa,flex,native,poly
    python bench/train_model.py --model llama3-8b-sigmoid               # B3: sigmoid attention
    python bench/train_model.py --plan --model llama3-8b                # CPU: the memory plan only
    python bench/train_model.py --dry-run                               # CPU: tiny configs, 3 steps
    (--json bench/results/train_model.json commits a run; --budget-s stops cleanly before a limit)

Models (random initialisation: timing needs no weights; BF16 autocast over FP32 master weights,
FP32 AdamW state, torch.compile per decoder layer):
* gemma2-2b: Gemma-2-2B as configured upstream (hidden 2304, 26 layers, 8/4 heads, head_dim
  256, attention softcap 50, final softcap 30, sliding window 4096 on alternate layers, GeGLU
  gelu_pytorch_tanh, vocab 256000, tied embeddings).
* llama3-8b: Llama-3-8B's layer shape (hidden 4096, 32/8 heads, head_dim 128, SwiGLU 14336,
  vocab 128256, untied head) with as many layers as fit one H200 at batch 4 x 4096 tokens
  (`--plan` computes it: parameters x 18 B + saved activations + the loss's transient, below).
* llama3-8b-sigmoid: the same with sigmoid attention (b = -ln S) in place of softmax (B3).

Arms (`--arms`, comma-separated; `attn` or `attn:mlp`):
  attention  eager (transformers' eager, compiled), sdpa (not with softcap: transformers refuses
             it; not for sigmoid), flex (transformers' flex_attention; not for sigmoid), native /
             poly (flash_attn_poly through its transformers integration, evaluator native / poly;
             softmax has no polynomial program, so Llama's poly arm differs from native in the MLP).
             The sigmoid model's eager arm is a torch sigmoid attention (compiled).
  mlp        torch (the model's own MLP, compiled), native / poly (our fused SwiGLU or GeGLU kernel
             with the SFU or the polynomial evaluator).  Default: torch for eager/sdpa/flex, the
             attention's evaluator for native/poly.
Every arm trains one model in one process (the same weights and optimizer): the arm is switched
between segments of `--segment` steps (transformers reads the attention implementation at every
call; the MLP reads its kind), in a rotating order, so the arms alternate under the same clocks
and torch.compile keeps one graph per arm (dynamo guards on the switch).

Protocol (the paper's): `--steps` (100) steps per arm; per step CUDA events around forward + loss,
backward, and the optimizer step (fused AdamW, lr 1e-5, betas 0.9/0.95, weight decay 0.1; random
tokens, so the step is timed, not the learning); a row is the median over that arm's steps 20 to
100 (`--skip`), tokens/s = batch x seqlen / that median; peak memory is the largest
torch.cuda.max_memory_allocated of the arm's segments.  An arm that runs out of memory is a row
with its error; `--batch` 0 (default) takes the planned batch.  The step calls the model as a
transformers training loop does (labels, use_cache=False), which includes transformers' one host
synchronisation per forward (its packed-sequence check of the position ids), the same for every arm.

Memory plan (`plan()`): the model is built on the meta device in BF16 and one forward with the loss
runs under saved-tensor hooks, counting the bytes autograd keeps per sequence (one storage once;
a fused attention stand-in keeps q, k, v, out and the FP32 log-sum-exp, as ours and flex do;
eager keeps its S x S matrices).  Parameters cost 18 B each: FP32 weight, FP32 gradient, two FP32
AdamW moments, and autocast's BF16 copy of the weight for the backward.  The loss's backward adds
a transient of 10 B per logit (FP32 gradients of the upcast and of the log-softmax, the BF16
gradient into the head).  The plan fits that total under `--mem-gib` x 0.92 (allocator
fragmentation); the device run prints the measured peak beside it.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The repository root goes LAST: first on sys.path it would shadow an installed (or, on the
# device machine, laid-out) flash_attn_poly whose kernels/ and asm/ live inside the package.
sys.path.append(os.path.dirname(HERE))
import protocol  # noqa: E402

GIB = 2**30
BYTES_PER_PARAM = 18          # FP32 weight + grad + 2 AdamW moments (16) + autocast BF16 copy (2)
TRANSIENT_PER_LOGIT = 10      # FP32 upcast grad + FP32 log-softmax grad + BF16 head grad
HEADROOM = 0.92               # fraction of the device memory the plan may fill
H200_GIB = 139.0              # usable memory of the lent H200 (torch's total_memory)
FIRST_SEGMENT_S = 90.0        # budget estimate of an arm's first (compiling) segment
ATTN_ARMS = ("eager", "sdpa", "flex", "native", "poly")
MLP_KINDS = ("torch", "native", "poly")


# ---- models -----------------------------------------------------------------------------------

def gemma2_config(tiny: bool = False):
    import transformers
    if tiny:
        return transformers.Gemma2Config(
            vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=8,
            query_pre_attn_scalar=64, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
            max_position_embeddings=128, hidden_activation="gelu_pytorch_tanh")
    return transformers.Gemma2Config(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=4096,
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        max_position_embeddings=8192, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True)


def llama3_config(layers: int, tiny: bool = False):
    import transformers
    if tiny:
        return transformers.LlamaConfig(
            vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128)
    return transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
        rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=False)


# model name -> (family, score function, default arms)
MODELS = {
    "gemma2-2b": ("gemma2", "softcap", ("eager", "flex", "native", "poly")),
    "llama3-8b": ("llama", "softmax", ("eager", "sdpa", "flex", "native", "poly")),
    "llama3-8b-sigmoid": ("llama", "sigmoid", ("eager", "native", "poly")),
}


def model_config(name: str, layers: int, tiny: bool):
    family = MODELS[name][0]
    return gemma2_config(tiny) if family == "gemma2" else llama3_config(layers, tiny)


# ---- attention implementations ----------------------------------------------------------------

def sigmoid_eager(query, key, value, scaling, probs=None):
    """Sigmoid attention in torch ((B, H, S, D) in, (B, S, H, D) out): p = sigmoid(q k^T * scale
    - ln S_k), causal (bottom-right), no normalisation; compiled with the layer.  probs(x, b):
    P of the scaled scores x and the bias b instead of sigmoid(x + b) (bench/loss_parity.py's
    clamped runs)."""
    from flash_attn_poly import reference
    grp = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(grp, 1), value.repeat_interleave(grp, 1)
    s_q, s_k = query.shape[2], key.shape[2]
    x = torch.matmul(query, k.transpose(-1, -2).to(query.dtype)).float() * scaling
    b = reference.default_sigmoid_bias(s_k)
    p = torch.sigmoid(x + b) if probs is None else probs(x, b)
    p = p.masked_fill(~reference.causal_mask(s_q, s_k, query.device), 0.0)
    return torch.matmul(p.to(v.dtype), v).transpose(1, 2).contiguous(), None


def _sigmoid_eager(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                   softcap=None, sliding_window=None, **kwargs):
    """transformers' attention function of sigmoid_eager."""
    return sigmoid_eager(query, key, value, scaling)


def _sigmoid_ours(evaluator: str, backend: str):
    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                softcap=None, sliding_window=None, **kwargs):
        from flash_attn_poly import interface
        from flash_attn_poly.integrations import transformers as fap_hf
        if attention_mask is not None:
            raise ValueError("sigmoid attention arm: an explicit (padding) mask is not supported")
        if query.is_cuda and backend != "reference":
            dt = fap_hf._kernel_dtype(query, key, value)
            query, key, value = (t.to(dt) for t in (query, key, value))
        out = interface.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                  "sigmoid", causal=True, evaluator=evaluator,
                                  softmax_scale=scaling, backend=backend)
        return out, None
    return forward


def register_attention(backend: str) -> None:
    """Our arms' names in transformers' AttentionInterface (and a mask function returning None
    for plain causal masks, so no mask is built for them)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    from flash_attn_poly.integrations import transformers as fap_hf
    for ev in ("native", "poly"):
        fap_hf.register(ev, backend, name=f"poly_attention_{ev}")
        AttentionInterface.register(f"sigmoid_{ev}", _sigmoid_ours(ev, backend))
        AttentionMaskInterface.register(f"sigmoid_{ev}", flash_attention_mask)
    AttentionInterface.register("sigmoid_eager", _sigmoid_eager)
    AttentionMaskInterface.register("sigmoid_eager", flash_attention_mask)


def attn_impl(score: str, attn: str) -> str:
    """transformers' attn_implementation name of an attention arm, or ValueError saying why not."""
    if score == "sigmoid":
        if attn in ("sdpa", "flex"):
            raise ValueError(f"{attn} cannot express sigmoid attention (it normalises by softmax)")
        return f"sigmoid_{attn}"
    if attn == "sdpa" and score == "softcap":
        raise ValueError("transformers' sdpa does not compute softcap (it refuses the call)")
    return {"eager": "eager", "sdpa": "sdpa", "flex": "flex_attention",
            "native": "poly_attention_native", "poly": "poly_attention_poly"}[attn]


def parse_arm(text: str) -> tuple[str, str]:
    attn, _, mlp = text.partition(":")
    if attn not in ATTN_ARMS:
        raise ValueError(f"arm {text!r}: attention must be one of {ATTN_ARMS}")
    mlp = mlp or (attn if attn in ("native", "poly") else "torch")
    if mlp not in MLP_KINDS:
        raise ValueError(f"arm {text!r}: mlp must be one of {MLP_KINDS}")
    return attn, mlp


# ---- the switchable MLP -----------------------------------------------------------------------

class SwitchMLP(nn.Module):
    """The model's MLP (`inner`, its own weights) or our fused GLU kernel on the same
    projections: down(glu(gate(x), up(x))).  `kind` is read at every call (dynamo guards on
    it, so each kind keeps its compiled graph)."""

    def __init__(self, inner: nn.Module, glu: str, backend: str):
        super().__init__()
        self.inner, self.glu, self.backend, self.kind = inner, glu, backend, "torch"

    def forward(self, x):
        if self.kind == "torch":
            return self.inner(x)
        from flash_attn_poly import activations as act
        fn = act.swiglu if self.glu == "swiglu" else act.geglu
        g, u = self.inner.gate_proj(x), self.inner.up_proj(x)
        return self.inner.down_proj(fn(g.contiguous(), u.contiguous(), self.kind, backend=self.backend))


def wrap_mlps(model, family: str, backend: str) -> list[SwitchMLP]:
    glu = "geglu" if family == "gemma2" else "swiglu"
    out = []
    for layer in model.model.layers:
        layer.mlp = SwitchMLP(layer.mlp, glu, backend)
        out.append(layer.mlp)
    return out


def set_arm(model, mlps, impl: str, mlp: str) -> None:
    model.config._attn_implementation = impl      # read by every attention call and mask builder
    for m in mlps:
        m.kind = mlp


# ---- memory plan ------------------------------------------------------------------------------

def _fused_attention_standin():
    """A meta-device attention that keeps what a fused kernel keeps for its backward."""
    class Fused(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out = torch.empty_like(q).transpose(1, 2).contiguous()
            lse = q.new_empty(q.shape[:3], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, g):
            q, k, v = ctx.saved_tensors[:3]
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def forward(module, query, key, value, attention_mask, **kwargs):
        return Fused.apply(query, key, value), None
    return forward


@functools.lru_cache(maxsize=None)
def saved_bytes(name: str, layers: int, seqlen: int, attn: str) -> tuple[int, int]:
    """(parameters, bytes autograd saves for one sequence of `seqlen` tokens, loss included)."""
    import transformers
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    AttentionInterface.register("plan_fused", _fused_attention_standin())
    AttentionMaskInterface.register("plan_fused", flash_attention_mask)
    AttentionInterface.register("sigmoid_eager", _sigmoid_eager)
    AttentionMaskInterface.register("sigmoid_eager", flash_attention_mask)
    cfg = model_config(name, layers, tiny=False)
    impl = {"eager": "eager", "sigmoid_eager": "sigmoid_eager"}.get(attn, "plan_fused")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl,
                                                              dtype=torch.bfloat16)
    seen: dict = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st._cdata] = max(seen.get(st._cdata, 0), st.nbytes())
        return t
    ids = torch.zeros(1, seqlen, dtype=torch.long, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        # use_cache left on: without a cache transformers checks position_ids for packed
        # sequences with a host-side .all(), which meta tensors cannot answer (the cache holds
        # references to k/v that autograd saves anyway: no bytes change)
        model(input_ids=ids, labels=ids)
    return sum(p.numel() for p in model.parameters()), sum(seen.values())


def plan(name: str, seqlen: int, batch: int, layers: int, attn: str = "fused",
         mem_gib: float = H200_GIB) -> dict:
    """Planned peak of a training step (GiB) and whether it fits; see the module docstring."""
    cfg = model_config(name, layers, tiny=False)
    if MODELS[name][1] == "sigmoid" and attn == "eager":
        attn = "sigmoid_eager"
    params, act = saved_bytes(name, layers, seqlen, attn)
    state = params * BYTES_PER_PARAM
    transient = batch * seqlen * cfg.vocab_size * TRANSIENT_PER_LOGIT
    total = state + batch * act + transient
    return {"model": name, "layers": cfg.num_hidden_layers, "seqlen": seqlen, "batch": batch,
            "attn": attn, "params_b": params / 1e9, "state_gib": state / GIB,
            "act_gib_per_seq": act / GIB, "transient_gib": transient / GIB,
            "total_gib": total / GIB, "limit_gib": mem_gib * HEADROOM,
            "fits": total / GIB <= mem_gib * HEADROOM}


def max_layers(seqlen: int = 4096, batch: int = 4, mem_gib: float = H200_GIB) -> tuple[int, dict]:
    """Llama-3-8B-shaped layers that fit (fused attention arms): the plan is linear in the layer
    count, so two meta runs (1 and 2 layers) give its intercept and slope."""
    p1, p2 = (plan("llama3-8b", seqlen, batch, n, mem_gib=mem_gib) for n in (1, 2))
    per_layer = p2["total_gib"] - p1["total_gib"]
    n = int((p1["limit_gib"] - (p1["total_gib"] - per_layer)) // per_layer)
    return n, {"per_layer_gib": per_layer, "base_gib": p1["total_gib"] - per_layer,
               **plan("llama3-8b", seqlen, batch, n, mem_gib=mem_gib)}


def max_batch(name: str, seqlen: int, layers: int, mem_gib: float = H200_GIB, attn: str = "fused") -> int:
    best = 0
    for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32):
        if plan(name, seqlen, b, layers, attn, mem_gib)["fits"]:
            best = b
    return best


# ---- timing -----------------------------------------------------------------------------------

class Arm:
    def __init__(self, text: str, score: str, batch: int):
        self.name, self.batch = text, batch
        self.attn, self.mlp = parse_arm(text)
        self.impl = attn_impl(score, self.attn)
        self.fwd: list[float] = []
        self.bwd: list[float] = []
        self.opt: list[float] = []
        self.peak = 0
        self.error: str | None = None
        self.losses: list[float] = []
        self.note: str | None = None

    def out_of_memory(self, e: Exception) -> None:
        """Halve this arm's batch and start its count again; at batch 1 the arm is an error row."""
        msg = f"out of memory at batch {self.batch}: {str(e).splitlines()[0][:100]}"
        if self.batch == 1:
            self.error = msg
            return
        self.note = msg + f"; ran at batch {self.batch // 2}"
        self.batch //= 2
        self.fwd, self.bwd, self.opt, self.losses, self.peak = [], [], [], [], 0

    @property
    def steps(self) -> int:
        return len(self.fwd)


def run_segment(model, mlps, opt, arm: Arm, batches: list, n: int, device, amp: bool) -> None:
    """`n` steps of `arm` on `batches` (token tensors of its batch size), timed per phase."""
    set_arm(model, mlps, arm.impl, arm.mlp)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    events = []
    for _ in range(n):
        ids = batches[len(arm.losses) % len(batches)]
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if cuda else None
        t = [time.perf_counter()]
        if cuda:
            ev[0].record()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss   # no KV cache in training
        if cuda:
            ev[1].record()
        t.append(time.perf_counter())
        loss.backward()
        if cuda:
            ev[2].record()
        t.append(time.perf_counter())
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            ev[3].record()
        t.append(time.perf_counter())
        events.append(ev if cuda else [1e3 * (t[i + 1] - t[i]) for i in range(3)])
        arm.losses.append(loss.detach())
    if cuda:
        torch.cuda.synchronize()
        arm.peak = max(arm.peak, torch.cuda.max_memory_allocated())
        events = [[e[i].elapsed_time(e[i + 1]) for i in range(3)] for e in events]
    for f, b, o in events:
        arm.fwd.append(f)
        arm.bwd.append(b)
        arm.opt.append(o)


# Where a step's time goes: kernel (CUDA) or op (CPU dry run) names by the first pattern that
# matches.  Every CuTe DSL kernel's name carries its module path "flash_attn_poly...", removed
# first; ours are AttnFwdSm90 / AttnBwdSm90 / attn_bwd_prepost (attention) and ElementwiseKernel
# (the fused GLU); inductor's names list the fused ops (triton_poi_fused_gelu_mul...), its
# templates (triton_tem...) are flex attention (no other template runs without max-autotune).
# aten's generic elementwise kernels (casts, copies, fills, scalar products: autocast's weight
# casts, clip_grad_norm_'s scaling, zeroed buffers) are "elementwise (aten)", not the MLP's.
PROFILE_CATEGORIES = (
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("loss", r"log_?softmax|nll_loss|cross_entropy"),
    ("mlp activation", r"gelu|silu|glu|elementwisekernel"),
    ("elementwise (aten)", r"elementwise_kernel|fillfunctor|copy_kernel"),
    ("attention", r"attn|attention|flash|fmha|flex|triton_tem|sdpa|softmax|sigmoid"),
    ("norms", r"rsqrt|rms_?norm"),
    ("matmul", r"gemm|xmma|nvjet|cutlass|cublas|matmul|addmm|bmm|aten::mm\b|linear"),
)


def classify(name: str) -> str:
    n = name.lower().replace("flash_attn_poly", "")
    return next((cat for cat, pat in PROFILE_CATEGORIES if re.search(pat, n)), "other")


PROFILE_TOP = 30   # kernels per arm kept by name whatever their time (the arms' per-kernel diff)
PROFILE_FLOOR_MS = 0.05   # and beyond those, every kernel of at least this many ms per step


def profile_arm(model, mlps, opt, arm: "Arm", batches: list, n: int, device, amp: bool) -> tuple:
    """(ms per step by category (PROFILE_CATEGORIES), the PROFILE_TOP kernels [{name, category,
    ms}] by ms per step) over `n` extra steps of `arm` under torch.profiler: CUDA kernel self
    time on the GPU, op self time on the CPU (dry run)."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.type == "cuda"
    scratch = Arm.__new__(Arm)
    scratch.__dict__.update(arm.__dict__, fwd=[], bwd=[], opt=[], losses=[], peak=0)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        run_segment(model, mlps, opt, scratch, batches, n, device, amp)
    out: dict = {}
    kernels: dict = {}
    for e in prof.key_averages():
        if cuda and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        cat = classify(e.key)
        out[cat] = out.get(cat, 0.0) + us / 1e3 / n
        kernels[e.key] = kernels.get(e.key, 0.0) + us / 1e3 / n
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1])
    top = ranked[:PROFILE_TOP] + [kv for kv in ranked[PROFILE_TOP:] if kv[1] >= PROFILE_FLOOR_MS]
    return ({k: out[k] for k in sorted(out, key=out.get, reverse=True)},
            [{"name": k[:200], "category": classify(k), "ms": v} for k, v in top])


def row(arm: Arm, model: str, seqlen: int, skip: int, target: int) -> dict:
    batch = arm.batch
    r = {"model": model, "arm": arm.name, "attention": arm.attn, "mlp": arm.mlp, "seqlen": seqlen,
         "batch": batch, "steps": arm.steps}
    if arm.error:
        r["error"] = arm.error
    if arm.note:
        r["note"] = arm.note
    if arm.steps > skip:
        step = [f + b + o for f, b, o in zip(arm.fwd, arm.bwd, arm.opt)][skip:]
        med = statistics.median(step)
        r.update(step_ms=med, fwd_ms=statistics.median(arm.fwd[skip:]),
                 bwd_ms=statistics.median(arm.bwd[skip:]), opt_ms=statistics.median(arm.opt[skip:]),
                 tokens_per_s=batch * seqlen / (med / 1e3), timed_steps=len(step),
                 loss_last=float(arm.losses[-1]))
    r["peak_mem_gb"] = arm.peak / 1e9 if arm.peak else None
    if getattr(arm, "clocks", None):   # mean SM clock / power over its timed segments (nvidia-smi)
        r.update(sm_mhz=arm.clocks["sm_mhz"], power_w=arm.clocks["power_w"], clock_reasons=arm.clocks["reasons"])
    if getattr(arm, "profile", None):
        r["profile_ms_per_step"] = arm.profile
        r["profile_top_kernels"] = arm.profile_kernels
    if arm.steps < target and not arm.error:
        r["incomplete"] = f"{arm.steps} of {target} steps (budget)"
    return r


def run_model(name: str, seqlen: int, batch: int, layers: int, arms: list[str], a, device,
              backend: str, deadline: float, log=print, eager_batch: int = 0) -> list[dict]:
    """One model, every arm alternating in segments; rows as the module docstring says.
    eager_batch: the eager arm's first batch when smaller (its S x S matrices; 0: `batch`)."""
    import transformers
    family, score, _ = MODELS[name]
    cfg = model_config(name, layers, a.dry_run)
    register_attention(backend)
    arm_objs, rows = [], []
    for text in arms:
        try:
            arm_objs.append(Arm(text, score, batch))
            if arm_objs[-1].attn == "eager" and eager_batch:
                arm_objs[-1].batch = min(batch, eager_batch)
            if device.type != "cuda" and arm_objs[-1].attn == "flex":
                arm_objs.pop()
                raise ValueError("FlexAttention has no CPU backward")
        except ValueError as e:
            rows.append({"model": name, "arm": text, "seqlen": seqlen, "batch": batch, "steps": 0,
                         "skipped": str(e)})
            log(f"  {name} {text}: skipped ({e})")
    if not arm_objs:
        return rows
    torch.manual_seed(0)
    amp = device.type == "cuda"
    with device:      # initialised where it runs (2.6 B parameters take a minute on a CPU)
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation=arm_objs[0].impl, dtype=torch.float32)
    model.train()
    mlps = wrap_mlps(model, family, backend)
    if a.compile != "none":
        # one graph per (layer kind, arm): Gemma-2's two layer kinds x arms; raise dynamo's limits
        torch._dynamo.config.recompile_limit = 64
        torch._dynamo.config.accumulated_recompile_limit = 4096
        for layer in model.model.layers:
            layer.compile(backend=a.compile_backend, dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (4 * batch, seqlen), generator=g).to(device)
    batches = lambda b: [tokens[i * b:(i + 1) * b] for i in range(4)]     # noqa: E731
    log(f"{name}: {cfg.num_hidden_layers} layers, {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B "
        f"params, batch {batch} x {seqlen}, arms {[x.name for x in arm_objs]}")
    rnd = 0
    seg_time: dict[str, float] = {}
    if os.path.join(HERE, "tools") not in sys.path:
        sys.path.insert(0, os.path.join(HERE, "tools"))
    import clocks     # SM clock / power per arm (nvidia-smi samples; none without nvidia-smi)
    sampler, segments = clocks.Sampler(period_ms=50), []
    sampler.__enter__()
    try:
        stopped = _alternate(name, arm_objs, model, mlps, opt, batches, device, amp, a, deadline, log, seg_time,
                             rnd, segments)
    finally:
        sampler.__exit__(None, None, None)
    for arm_name, stat in clocks.per_name(sampler.samples(), segments).items():
        next(x for x in arm_objs if x.name == arm_name).clocks = stat
    if stopped:     # the budget stopped the alternation: no profiles
        return rows + [row(x, name, seqlen, a.skip, a.steps) for x in arm_objs]
    for arm in arm_objs:
        if a.profile_steps and arm.error is None and time.time() < deadline:
            try:
                arm.profile, arm.profile_kernels = profile_arm(model, mlps, opt, arm, batches(arm.batch),
                                                               a.profile_steps, device, amp)
            except Exception as e:  # noqa: BLE001 - the profile is extra; the timings stand
                log(f"  profile of {arm.name} failed: {type(e).__name__}: {e}")
    rows += [row(x, name, seqlen, a.skip, a.steps) for x in arm_objs]
    del model, opt, tokens
    torch._dynamo.reset()          # the next model (another length) compiles its own graphs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def _alternate(name, arm_objs, model, mlps, opt, batches, device, amp, a, deadline, log, seg_time, rnd,
               segments) -> bool:
    """The arms alternating in segments until done (False) or the budget stops them (True);
    segments gets (arm, host start, host end) of every segment after an arm's first (compiling) one."""
    while True:
        live = [x for x in arm_objs if x.error is None and x.steps < a.steps]
        if not live:
            break
        order = live[rnd % len(live):] + live[:rnd % len(live)]     # rotate who goes first
        rnd += 1
        for arm in order:
            # an arm's first segment compiles its graphs: about a minute per layer kind on the H200
            est = seg_time.get(arm.name, FIRST_SEGMENT_S if a.compile != "none" else 0.0)
            if time.time() + est > deadline:
                log(f"  budget: stopping before {arm.name} (segment ~{est:.0f} s)")
                return True
            n = min(a.segment, a.steps - arm.steps)
            t0, warm = time.time(), arm.steps > 0
            try:
                run_segment(model, mlps, opt, arm, batches(arm.batch), n, device, amp)
                if warm:
                    segments.append((arm.name, t0, time.time()))
            except torch.OutOfMemoryError as e:
                arm.out_of_memory(e)
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001 - one broken arm must not hide the others
                if "out of memory" in str(e).lower():      # e.g. wrapped by the compiler
                    arm.out_of_memory(e)
                    torch.cuda.empty_cache()
                else:
                    import traceback
                    traceback.print_exc()
                    arm.error = f"{type(e).__name__}: {str(e)[:200]}"
                opt.zero_grad(set_to_none=True)
            if arm.fwd:     # later segments: this arm's step time (no compile)
                recent = [f + b + o for f, b, o in zip(arm.fwd[-n:], arm.bwd[-n:], arm.opt[-n:])]
                seg_time[arm.name] = statistics.median(recent) / 1e3 * a.segment + 1.0
            else:           # restarted at a smaller batch: compiles again
                seg_time.pop(arm.name, None)
            last = f"{arm.fwd[-1] + arm.bwd[-1] + arm.opt[-1]:.1f} ms" if arm.fwd else "-"
            log(f"  {name} {arm.name:12s} steps {arm.steps:3d} last step {last} "
                f"({time.time() - t0:.1f} s){' ' + arm.error if arm.error else ''}")
    return False


# ---- output -----------------------------------------------------------------------------------

COLS = ["model", "arm", "seqlen", "batch", "steps", "tokens_per_s", "step_ms", "fwd_ms", "bwd_ms",
        "opt_ms", "peak_mem_gb"]


def markdown(out: dict) -> str:
    lines = [f"# Training step through transformers ({out['device']}, {out['date']}, commit {out['commit']})",
             "", protocol.doc_body(__doc__).split("\n\n")[0], "",
             f"Protocol: {out['protocol']}", ""]
    for p in out.get("plans", []):
        lines.append(f"- plan {p['model']} S={p['seqlen']}: {p['layers']} layers, batch {p['batch']}, "
                     f"{p['params_b']:.2f} B params, planned peak {p['total_gib']:.1f} GiB "
                     f"(limit {p['limit_gib']:.1f})")
    rows = [r for r in out["rows"] if "tokens_per_s" in r]
    clk = ["sm_mhz", "power_w"] if any("sm_mhz" in r for r in rows) else []   # nvidia-smi, timed segments
    lines += ["", protocol.markdown_table(rows, COLS + clk), ""]
    prof = [r for r in out["rows"] if r.get("profile_ms_per_step")]
    if prof:
        cats = sorted({c for r in prof for c in r["profile_ms_per_step"]})
        lines += ["Where the step's time goes (ms per step, kernel self time under torch.profiler):", "",
                  "| model | arm | seqlen | " + " | ".join(cats) + " |", "|---" * (len(cats) + 3) + "|"]
        for r in prof:
            lines.append(f"| {r['model']} | {r['arm']} | {r['seqlen']} | " + " | ".join(
                f"{r['profile_ms_per_step'].get(c, 0.0):.1f}" for c in cats) + " |")
        lines.append("")
        lines += kernel_diff(prof)
    for r in out["rows"]:
        for k in ("error", "skipped", "incomplete", "note"):
            if k in r:
                lines.append(f"- {r['model']} S={r['seqlen']} {r['arm']}: {k}: {r[k]}")
    return "\n".join(lines) + "\n"


def kernel_diff(prof: list, n: int = 25) -> list:
    """Markdown lines: per (model, seqlen), the kernels of every profiled arm side by side (ms per
    step; the union of each arm's top kernels, the n largest by their largest time): where two
    arms' steps differ outside the category totals."""
    lines = []
    for key in dict.fromkeys((r["model"], r["seqlen"]) for r in prof):
        rs = [r for r in prof if (r["model"], r["seqlen"]) == key and r.get("profile_top_kernels")]
        if not rs:
            continue
        ms = {r["arm"]: {k["name"]: k["ms"] for k in r["profile_top_kernels"]} for r in rs}
        cat = {k["name"]: k["category"] for r in rs for k in r["profile_top_kernels"]}
        names = sorted(cat, key=lambda nm: -max(m.get(nm, 0.0) for m in ms.values()))[:n]
        spread = lambda nm: max(m.get(nm, 0.0) for m in ms.values()) - min(m.get(nm, 0.0) for m in ms.values())
        names += [nm for nm in sorted(cat, key=lambda nm: -spread(nm)) if nm not in names and spread(nm) >= 0.3][:n]
        arms = list(ms)
        lines += [f"Kernels, {key[0]} S={key[1]}: the {n} largest, then those whose arms differ by >= 0.3 ms "
                  f"(ms per step; '-': not run by that arm, or below its top {PROFILE_TOP} and "
                  f"{PROFILE_FLOOR_MS} ms):", "",
                  "| kernel | category | " + " | ".join(arms) + " |", "|---" * (len(arms) + 2) + "|"]
        for nm in names:
            cells = " | ".join(f"{ms[a][nm]:.2f}" if nm in ms[a] else "-" for a in arms)
            lines.append(f"| `{nm[:90]}` | {cat[nm]} | {cells} |")
        lines.append("")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gemma2-2b", help=f"comma-separated: {list(MODELS)}")
    p.add_argument("--seqlen", default="4096", help="comma-separated sequence lengths")
    p.add_argument("--arms", default="", help="comma-separated arms (default: every arm the model allows)")
    p.add_argument("--batch", type=int, default=0, help="0: the planned batch (largest that fits)")
    p.add_argument("--layers", type=int, default=0, help="Llama: 0 = as many as fit at batch 4 x 4096")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--skip", type=int, default=20, help="steps of each arm left out of the median")
    p.add_argument("--segment", type=int, default=10, help="steps an arm runs before the next one")
    p.add_argument("--compile", choices=("layers", "none"), default="layers")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--mem-gib", type=float, default=0.0, help="device memory (default: the device's)")
    p.add_argument("--budget-s", type=float, default=0.0, help="stop starting segments after this many s")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the timed steps, this many more per arm under torch.profiler: ms per "
                        "step in attention, matmul, MLP activation, norms, loss, optimizer, other")
    p.add_argument("--plan", action="store_true", help="print the memory plan only (CPU, meta device)")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU: tiny configs of every model, reference backend, 3 steps per arm")
    protocol.add_json_arg(p, "train_model")
    a = p.parse_args(argv)
    t_start = time.time()
    names = [s for s in a.model.split(",") if s]
    for n in names:
        if n not in MODELS:
            p.error(f"--model: unknown model {n!r}; choose from {list(MODELS)}")
    seqlens = [int(s) for s in a.seqlen.split(",") if s]
    mem = a.mem_gib or (torch.cuda.mem_get_info()[1] / GIB if torch.cuda.is_available() else H200_GIB)
    if a.dry_run:
        names = list(MODELS) if a.model == p.get_default("model") else names
        seqlens, a.steps, a.skip, a.segment = [32], 3, 1, 1
        a.profile_steps = a.profile_steps or 1
        a.compile = "none" if a.compile_backend == "inductor" else a.compile
    plans = []
    if not a.dry_run:
        for n in names:
            for s in seqlens:
                # Llama: the layer count that fits at the paper's batch 4 x 4096, at every length
                layers = a.layers or (max_layers(4096, 4, mem)[0] if MODELS[n][0] == "llama" else 26)
                batch = a.batch or max_batch(n, s, layers, mem)
                pl = plan(n, s, batch, layers, mem_gib=mem)
                plans.append(pl)
                protocol.progress(f"plan {n} S={s}: {layers} layers, batch {batch}, "
                                  f"{pl['params_b']:.2f} B params, state {pl['state_gib']:.1f} GiB + "
                                  f"activations {pl['act_gib_per_seq']:.1f} GiB/seq x {batch} + loss "
                                  f"{pl['transient_gib']:.1f} GiB = {pl['total_gib']:.1f} GiB "
                                  f"(limit {pl['limit_gib']:.1f})")
        if a.plan:
            return 0
    cuda = torch.cuda.is_available() and not a.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    backend = "cuda" if cuda else "reference"
    deadline = t_start + a.budget_s if a.budget_s else float("inf")
    rows = []
    for n in names:
        arms = [s for s in a.arms.split(",") if s] or list(MODELS[n][2])
        for s in seqlens:
            pl = next((x for x in plans if x["model"] == n and x["seqlen"] == s), None)
            batch = pl["batch"] if pl else 2
            layers = pl["layers"] if pl else 2
            wants_eager = any(parse_arm(x)[0] == "eager" for x in arms)
            eager = max(1, max_batch(n, s, layers, mem, "eager")) if pl and wants_eager and not a.batch else 0
            rows += run_model(n, s, batch, layers, arms, a, device, backend, deadline,
                              log=lambda m: print(m, flush=True), eager_batch=eager)
    out = {**protocol.header(protocol.Timing()), "plans": plans, "rows": rows,
           "protocol": (f"{a.steps} steps per arm alternating in segments of {a.segment}; median of "
                        f"steps {a.skip}-{a.steps} of (forward + loss, backward, optimizer step) "
                        f"between CUDA events; compile {a.compile}"),
           "dry_run": a.dry_run, "total_s": time.time() - t_start}
    text = markdown(out)
    print(text)
    protocol.write_results(protocol.output_path(a.json, "train_model"), out, text)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
