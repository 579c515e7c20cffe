"""A lean decode step for Llama-family models (Llama, Mistral, Qwen2, Qwen3).

One decode step of the engine feeds one token per live row through the model. Through
``transformers`` that step is ~1,000 small tensor ops (module calls, a 4-D mask built from
the 2-D one, key/value heads repeated for grouped-query attention), and at the row counts
of a GRPO rollout (1..64) their overhead is a fifth of the step on a CPU. ``LeanDecoder``
runs the same arithmetic straight from the model's own parameters (shared, never copied):

- the 2-D key mask goes to attention as a broadcast boolean mask, nothing is expanded;
- grouped-query attention needs no repeated keys: the ``G`` query heads that share a
  key/value head are laid out as ``G`` query positions of that head, ``(B, KV, G, D)``,
  so one attention call covers them against the cache's ``(B, KV, L, D)``;
- every projection goes through a oneDNN-prepacked copy of its weight on CPUs that have
  oneDNN, the ones that read the same input fused into one matrix (q, k and v; gate and up):
  4 matrix products a layer instead of 7, each reading a layout made for it. The copies are
  made at a generation's first step, re-packed only when the weights change (tracked by
  their version counters) and freed with the KV cache (``release``). MKL's plain sgemm
  re-packs a weight on every call when the row count is small; on this project's 2-core CPU
  the packed step decodes the default workload at 1.15x the per-projection one (median of 6
  seeds; most of its steps have few live rows). Elsewhere (no oneDNN, a GPU, bf16 without
  the CPU's bf16 units) each projection runs on its own, as before.

Rows that share a prompt (a GRPO group's n samples, admitted together) read its keys and values
once a step instead of n times (``SharedPrefixes``, built by the engine core): attention over the
prompt's columns runs for the group's queries against one member's cache, attention over the
rest for every row, and the two are merged by their log-sum-exps (the cascade attention of
FlashInfer and Hydragen). Decode attention is bound by reading the cache, so on a CPU a group of 8
with a 300-token prompt attends in a third of the time.

Prefill (many tokens per row, once per call) stays with the model's own forward, which
fills the same cache. Anything outside the family, or with features this step does not
implement (sliding windows, partial rotary, MLP biases), keeps the ``transformers`` step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlvr.models.lora import active_adapters, lora_delta
from rlvr.rollout.kv_cache import supports_preallocated

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")


def supports_lean_decode(model) -> bool:
    config = model.config
    return (
        getattr(config, "model_type", None) in LLAMA_FAMILY
        and supports_preallocated(config)
        and getattr(config, "hidden_act", None) == "silu"
        and not getattr(config, "mlp_bias", False)
        and getattr(config, "pretraining_tp", 1) == 1
        and getattr(config, "partial_rotary_factor", 1.0) == 1.0
        and hasattr(model, "model") and hasattr(model.model, "rotary_emb")
    )


def _norm(norm, x: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm module as one fused op."""
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def _linear(proj, x: torch.Tensor, weight_first: bool) -> torch.Tensor:
    """``x @ W.T + b`` -> (B, N); ``weight_first`` computes it as ``(W @ x.T).T`` (a view).
    A LoRA layer adds its adapters' low-rank term, as peft's forward does."""
    base = getattr(proj, "base_layer", proj)
    if not weight_first:
        y = F.linear(x, base.weight, base.bias)
    else:
        y = torch.mm(base.weight, x.t()).t()
        y = y if base.bias is None else y + base.bias
    delta = lora_delta(proj, x)
    return y if delta is None else y + delta


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the last dimension, Llama's half-split convention: with x = [x1, x2],
    rotate_half(x) * sin = [-x2, x1] * sin = roll(x, D/2) * [-sin1, sin2] (``signed_sin``)."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin


@dataclass
class PrefixBatch:
    """Groups whose shared prompt ends at the same column: group s's rows ``members[s]`` (slots,
    padded with repeats of the first) attend to columns [lo, hi) of slot ``members[s, 0]`` under
    ``mask[s]`` (additive, (S, 1, 1, hi - lo)); entry ``real[j]`` of ``members`` flattened is
    the real row ``slots[j]``."""

    lo: int
    hi: int
    members: torch.Tensor  # (S, m)
    leads: slice | torch.Tensor  # members[:, 0]: a slice when evenly spaced (the cache is then read in place)
    mask: torch.Tensor  # (S, 1, 1, hi - lo)
    real: torch.Tensor  # (R,)
    slots: torch.Tensor  # (R,)


@dataclass
class SharedPrefixes:
    """A decode step's cascade: every row attends to columns [start, L) of its own cache row, and
    the rows of each batch also to their group's shared prompt columns (``PrefixBatch``)."""

    start: int
    batches: list[PrefixBatch]


def shared_prefix_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                            scale: float, prefixes: SharedPrefixes) -> torch.Tensor:
    """``scaled_dot_product_attention(q, keys, values, mask)`` for q (B, KV, G, D), keys and values
    (B, KV, L, D), mask (B, 1, 1, L) additive, where each batch's rows hold the same keys and values
    (and mask) in its columns [lo, hi) as its first row: those columns are read once per group.
    Softmax over a union of disjoint column sets is the two partial softmaxes weighted by their
    sums: o = (o_a e^{l_a} + o_b e^{l_b}) / (e^{l_a} + e^{l_b}), l the log-sum-exp of each part."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    c = prefixes.start
    out, lse = flash(q, keys[:, :, c:], values[:, :, c:], attn_mask=mask[..., c:], scale=scale)[:2]
    B, KV, G, D = q.shape
    out, lse = out.float(), lse.unsqueeze(-1)  # (B, KV, G, 1)
    for batch in prefixes.batches:
        S, m = batch.members.shape
        first = batch.leads
        qa = q[batch.members.reshape(-1)].reshape(S, m, KV, G, D).transpose(1, 2).reshape(S, KV, m * G, D)
        oa, la = flash(qa, keys[first, :, batch.lo:batch.hi], values[first, :, batch.lo:batch.hi],
                       attn_mask=batch.mask, scale=scale)[:2]
        oa = oa.reshape(S, KV, m, G, D).transpose(1, 2).reshape(S * m, KV, G, D)[batch.real]
        la = la.reshape(S, KV, m, G).transpose(1, 2).reshape(S * m, KV, G, 1)[batch.real]
        ob, lb = out[batch.slots], lse[batch.slots]
        top = torch.maximum(la, lb)
        wa, wb = torch.exp(la - top), torch.exp(lb - top)
        out[batch.slots] = (oa.float() * wa + ob * wb) / (wa + wb)  # a row is in one batch at most
    return out.to(q.dtype)


class PackedLinear:
    """``x @ W.T + b`` for one projection, or several that read the same input with their outputs
    side by side (``W`` their weights stacked), through a oneDNN-prepacked copy re-packed when
    any weight or bias changes (each is read from its module at every call: an engine's weights
    may be replaced or get their storage after construction). A LoRA layer's active adapters are
    merged into the packed copy (``W + scaling * B @ A``, as vLLM merges them), so a decode step
    pays no low-rank products; the copy follows the adapters' weights, their switching on and off
    and which are active, like the base's.

    Falls back to ``F.linear`` (plus the adapters' term) where oneDNN is absent (non-x86 builds)
    or the weight is not a CPU float32/bfloat16 matrix.
    """

    def __init__(self, *linears: torch.nn.Module):
        self.linears = linears
        # read once: a decode step makes hundreds of these calls, and a module's attribute lookup
        # is slow (a LoRA wrapping after this point would replace the modules themselves)
        self.bases = [getattr(linear, "base_layer", linear) for linear in linears]
        self.adapted = [linear for linear in linears if hasattr(linear, "lora_A")]
        self.sizes = None  # each projection's output width, once read
        self._packed = self._bias = self._key = None

    @property
    def weight(self) -> torch.Tensor:
        return self.bases[0].weight

    @property
    def enabled(self) -> bool:
        weight = self.weight
        # oneDNN's bf16 path needs avx512bw/vl/dq or avx_ne_convert; on other CPUs (AVX2 EPYCs) its
        # reorder raises, so bf16 falls back to a plain linear there
        dtype_ok = weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and bf16_prepack_supported())
        return (weight.device.type == "cpu" and dtype_ok and torch.backends.mkldnn.is_available()
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))

    @staticmethod
    def _merged_weight(linear: torch.nn.Module) -> torch.Tensor:
        """The layer's weight with its active adapters' ``scaling * B @ A`` (peft's own delta) added."""
        weight = getattr(linear, "base_layer", linear).weight.detach()
        names = active_adapters(linear) if hasattr(linear, "lora_A") else []
        if not names:
            return weight
        merged = weight.float() + sum(linear.get_delta_weight(name).detach().float() for name in names)
        return merged.to(weight.dtype)

    def _stacked(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        bases = self.bases
        self.sizes = [base.weight.shape[0] for base in bases]
        weights = [self._merged_weight(linear) for linear in self.linears]
        weight = torch.cat(weights) if len(weights) > 1 else weights[0]
        if all(base.bias is None for base in bases):
            return weight, None
        return weight, torch.cat([base.bias.detach() if base.bias is not None else weight.new_zeros(base.weight.shape[0])
                                  for base in bases])

    def _version_key(self) -> list:
        """What the packed copy was made from: every weight and bias (storage and version) and, for
        a LoRA layer, its active adapters, their scaling and their A and B weights."""
        key = [(t.data_ptr(), t._version) for base in self.bases for t in (base.weight, base.bias) if t is not None]
        for linear in self.adapted:
            for name in active_adapters(linear):
                a, b = linear.lora_A[name].weight, linear.lora_B[name].weight
                key.append((name, linear.scaling[name], a.data_ptr(), a._version, b.data_ptr(), b._version))
        return key

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The projections' outputs side by side, their adapters' terms included."""
        if self.enabled:
            return self.packed(x)
        outs = [_linear(linear, x, weight_first=False) for linear in self.linears]
        return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]

    def packed(self, x: torch.Tensor) -> torch.Tensor:
        """The oneDNN path (the caller has checked ``enabled``), adapters merged."""
        key = self._version_key()
        if key != self._key:
            weight, self._bias = self._stacked()
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 32)
            self._key = key
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self._bias, "none", [], "")

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each projection's output by the oneDNN path (the adapters merged into it)."""
        y = self.packed(x)
        return y.split(self.sizes, dim=-1) if len(self.sizes) > 1 else [y]

    def release(self) -> None:
        self._packed = self._bias = self._key = None


def bf16_prepack_supported() -> bool:
    """Whether this CPU runs oneDNN's bf16 linear (avx512bw/vl/dq or avx_ne_convert)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check and check())


class LeanDecoder:
    """``step(tokens, key_mask, positions, cache) -> logits`` for one token per row."""

    WEIGHT_FIRST_ROWS = (8, 48)
    """Row counts at which float32 projections run as ``W @ x.T`` on MKL, which then does not
    re-pack the weight matrix for the call. On this project's 2-core CPU a whole decode step of
    the built-in model took 0.76-0.86x the time at 16-48 rows, ~0.97x at 8 and 64, and 1.05x
    at 4 (the projections alone: 1.4-1.6x at 2 rows)."""

    def __init__(self, model):
        self.model = model
        self.inner = model.model
        self.head = PackedLinear(model.lm_head)
        self.packed = [(PackedLinear(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                        PackedLinear(layer.self_attn.o_proj), PackedLinear(layer.mlp.gate_proj, layer.mlp.up_proj),
                        PackedLinear(layer.mlp.down_proj)) for layer in self.inner.layers]
        self.packed_ok = None  # decided at each step: the weights' device and dtype may change
        self.weight_first_ok = None  # decided at the first step, when the weights have their device

    def _weight_first_possible(self) -> bool:
        weight = self.model.lm_head.weight
        return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkl.is_available()

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, key_mask: torch.Tensor, positions: torch.Tensor, cache,
             prefixes: SharedPrefixes | None = None) -> torch.Tensor:
        """tokens, positions: (B,); key_mask: (B, L) with L = cached length + 1 -> logits (B, V).
        ``prefixes``: the rows' shared prompt columns, read once per group (a CPU cache only)."""
        inner = self.inner
        B = tokens.shape[0]
        h = inner.embed_tokens(tokens)  # (B, hidden); the module, so a LoRA adapter on it applies
        cos, sin = inner.rotary_emb(h, positions.unsqueeze(-1))  # (B, 1, D)
        half = sin.shape[-1] // 2
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        cos, signed_sin = cos.unsqueeze(1), signed_sin.unsqueeze(1)  # (B, 1, 1, D): broadcast over heads
        # additive mask, built once instead of converted from booleans in every layer
        mask = torch.zeros(key_mask.shape, dtype=h.dtype, device=h.device).masked_fill_(key_mask == 0, float("-inf"))
        mask = mask[:, None, None, :]  # (B, 1, 1, L)
        if self.weight_first_ok is None:
            self.weight_first_ok = self._weight_first_possible()
        wf = self.weight_first_ok and self.WEIGHT_FIRST_ROWS[0] <= B <= self.WEIGHT_FIRST_ROWS[1]
        packed = self.packed_ok if self.packed_ok is not None else self.head.enabled
        for i, layer in enumerate(inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            kv_heads = attn.config.num_key_value_heads
            D = attn.head_dim
            x = _norm(layer.input_layernorm, h)
            qkv, o_proj, gate_up, down = self.packed[i]
            if packed:
                q, k, v = qkv.split(x)
            else:
                q, k, v = (_linear(proj, x, wf) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
            q = q.reshape(B, kv_heads, -1, D)  # (B, KV, G, D): G query heads per kv head
            k, v = k.reshape(B, kv_heads, 1, D), v.reshape(B, kv_heads, 1, D)
            if hasattr(attn, "q_norm"):  # Qwen3: per-head RMSNorm before the rotation
                q, k = _norm(attn.q_norm, q), _norm(attn.k_norm, k)
            qk = _rotate(torch.cat((q, k), dim=2), cos, signed_sin)  # one rotation for both: (B, KV, G + 1, D)
            keys, values = cache.layers[i].update(qk[:, :, -1:], v)  # (B, KV, L, D)
            if prefixes is None:
                o = F.scaled_dot_product_attention(qk[:, :, :-1], keys, values, attn_mask=mask, scale=attn.scaling)
            else:
                o = shared_prefix_attention(qk[:, :, :-1], keys, values, mask, attn.scaling, prefixes)
            o = o.reshape(B, -1)
            h = h + (o_proj.split(o)[0] if packed else _linear(attn.o_proj, o, wf))
            x = _norm(layer.post_attention_layernorm, h)
            gate, up = gate_up.split(x) if packed else (_linear(mlp.gate_proj, x, wf), _linear(mlp.up_proj, x, wf))
            act = F.silu(gate) * up
            h = h + (down.split(act)[0] if packed else _linear(mlp.down_proj, act, wf))
        return self.head(_norm(inner.norm, h))  # an adapter on the head counts, as on any projection

    def release(self) -> None:
        self.head.release()
        for projections in self.packed:
            for projection in projections:
                projection.release()
