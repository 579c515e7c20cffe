"""The lean decode step computes what the transformers forward computes, for every model
family it claims, and the engine falls back to the transformers step for the rest."""

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from rlvr.config.schema import RolloutConfig
from rlvr.rollout import NativeRollout, SamplingParams
from rlvr.rollout.kv_cache import make_cache
from rlvr.rollout.lean import LeanDecoder, PackedLinear, supports_lean_decode

SIZES = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)


def tiny(cls, config_cls, **extra):
    torch.manual_seed(0)
    return cls(config_cls(**SIZES, **extra)).eval()


def with_lora(model):
    """Llama with a LoRA adapter on every linear layer, its B matrices random (peft starts them at
    zero, which would make the adapter a no-op); the wrapped model, whose layers carry the adapter."""
    from rlvr.models.lora import apply_lora, unwrap

    peft_model = apply_lora(model, rank=4, alpha=8.0, target_modules="all-linear")
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    return unwrap(peft_model).eval()


FAMILIES = {
    "llama": lambda: tiny(LlamaForCausalLM, LlamaConfig, tie_word_embeddings=True),
    "llama-bias-rope-scaling": lambda: tiny(LlamaForCausalLM, LlamaConfig, attention_bias=True,
                                            rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "qwen2": lambda: tiny(Qwen2ForCausalLM, Qwen2Config),  # q/k/v biases
    "qwen3": lambda: tiny(Qwen3ForCausalLM, Qwen3Config, head_dim=16),  # per-head q/k norms, head_dim != hidden/heads
    "llama-lora": lambda: with_lora(tiny(LlamaForCausalLM, LlamaConfig, tie_word_embeddings=True)),
}


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "per-projection"])
@pytest.mark.parametrize("rows", [2, 12])  # 12 rows: per projection, they run weight-first (W @ x.T)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lean_step_equals_the_transformers_step(family, rows, packed):
    model = FAMILIES[family]()
    with torch.no_grad():  # random biases where there are any: the default init leaves them at zero
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_()
    assert supports_lean_decode(model)
    lean = LeanDecoder(model)
    lean.weight_first_ok = True  # whatever BLAS this torch has, check the weight-first path too
    if packed and not lean.head.enabled:
        pytest.skip("no oneDNN in this torch: the projections run one by one")
    lean.packed_ok = packed
    # left-padded prompts (lengths 5 and 3, alternating), then three decode steps through each path
    prompt = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 10, 11, 12]]).repeat(rows // 2, 1)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]).repeat(rows // 2, 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    caches = [make_cache(model.config, 16), make_cache(model.config, 16)]
    with torch.inference_mode():
        for cache in caches:
            model(input_ids=prompt, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        last, step_mask = positions[:, -1], mask
        for token in ([13, 14], [15, 16], [17, 18]):
            tokens = torch.tensor(token).repeat(rows // 2)
            step_mask = torch.cat([step_mask, torch.ones(rows, 1, dtype=torch.long)], dim=1)
            last = last + 1
            ref = model(input_ids=tokens[:, None], attention_mask=step_mask, position_ids=last[:, None],
                        past_key_values=caches[0], use_cache=True).logits[:, -1]
            got = lean.step(tokens, step_mask, last, caches[1])
            assert (got - ref).abs().max() < 1e-5


def test_unsupported_models_keep_the_transformers_step(tokenizer):
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2,
                                      eos_token_id=tokenizer.eos_token_id)).eval()
    sliding = tiny(Qwen2ForCausalLM, Qwen2Config, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert not supports_lean_decode(gpt2) and not supports_lean_decode(sliding)
    engine = NativeRollout(gpt2, tokenizer, RolloutConfig(), max_response_length=4)
    assert engine.lean is None
    out = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, do_sample=False))
    assert 1 <= len(out[0].token_ids) <= 4


def test_lean_decode_can_be_switched_off(tiny_model_dir, tokenizer):
    from rlvr.models import load_model
    model = load_model(tiny_model_dir)
    assert NativeRollout(model, tokenizer, RolloutConfig(), 4).lean is not None
    assert NativeRollout(model, tokenizer, RolloutConfig(lean_decode=False), 4).lean is None


def test_packed_projection_follows_weight_updates():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    weight = head.weight
    packed, x = PackedLinear(head), torch.randn(3, 8)
    assert (packed(x) - x @ weight.T).abs().max() < 1e-5
    with torch.no_grad():
        weight.mul_(2.0)  # an optimizer step: in place, bumps the version counter
    assert (packed(x) - x @ weight.T).abs().max() < 1e-5
    packed.release()
    assert (packed(x) - x @ weight.T).abs().max() < 1e-5


def test_fused_projections_split_back_with_their_biases_and_follow_updates():
    """q (6 wide, with a bias), k (2, without) and v (2, with) through one packed matrix: each
    output is its own x @ W.T + b, and an update of one weight is seen at the next call."""
    torch.manual_seed(0)
    q, k, v = torch.nn.Linear(8, 6), torch.nn.Linear(8, 2, bias=False), torch.nn.Linear(8, 2)
    fused, x = PackedLinear(q, k, v), torch.randn(3, 8)
    for _ in range(2):
        for got, proj in zip(fused.split(x), (q, k, v)):
            assert got.shape == (3, proj.out_features) and (got - proj(x)).abs().max() < 1e-5
        with torch.no_grad():
            k.weight.add_(1.0)  # in place: bumps its version counter


def test_packed_lora_projection_merges_its_adapter_and_follows_it():
    """A LoRA layer's packed copy holds W + scaling * B @ A, so a decode step runs no low-rank
    products: its output is peft's forward, also after an optimizer step on the adapter, with the
    adapter switched off (the base alone) and on again."""
    model = with_lora(tiny(LlamaForCausalLM, LlamaConfig))
    proj = model.model.layers[0].self_attn.q_proj
    packed, x = PackedLinear(proj), torch.randn(3, 32)
    if not packed.enabled:
        pytest.skip("no oneDNN in this torch: the projections run one by one")
    base = torch.nn.functional.linear(x, proj.base_layer.weight)
    with torch.no_grad():
        assert (packed(x) - proj(x)).abs().max() < 1e-5
        assert (proj(x) - base).abs().max() > 1e-2  # the adapter changes the output: a copy without it would fail
        proj.lora_A["default"].weight.add_(0.5)  # an optimizer step: in place, bumps the version counter
        assert (packed(x) - proj(x)).abs().max() < 1e-5
        proj.enable_adapters(False)
        assert (packed(x) - base).abs().max() < 1e-5
        proj.enable_adapters(True)
        assert (packed(x) - proj(x)).abs().max() < 1e-5 and (packed(x) - base).abs().max() > 1e-2


def test_unpacked_projections_add_their_adapters_terms(monkeypatch):
    """Where nothing is packed (no oneDNN, a GPU, bf16 without the CPU's bf16 units) the fused
    projections run one by one, each with its adapter's term: q, k and v side by side equal peft's."""
    model = with_lora(tiny(LlamaForCausalLM, LlamaConfig))
    attn = model.model.layers[0].self_attn
    monkeypatch.setattr(PackedLinear, "enabled", property(lambda self: False))
    fused, x = PackedLinear(attn.q_proj, attn.k_proj, attn.v_proj), torch.randn(3, 32)
    with torch.no_grad():
        expected = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)
        bases = torch.cat([p.base_layer(x) for p in (attn.q_proj, attn.k_proj, attn.v_proj)], dim=-1)
        assert (fused(x) - expected).abs().max() < 1e-5 and (expected - bases).abs().max() > 1e-2


def test_shared_prefix_attention_reads_each_groups_prompt_once():
    """Six rows, (KV, G, D) = (2, 3, 4), 12 columns. Group A is slots 0, 3 and 5 (prompt columns
    [2, 7), a hole at column 3), group B slots 1 and 4 (columns [4, 7)), slot 2 shares nothing (its
    first own column is 7, where every row's attention over its own columns starts). A group's
    members hold its first row's keys, values and mask in the prompt columns, as the engine's rows
    do. The result equals one softmax over all of each row's columns (SDPA, the reference), and a
    member's own copy of the prompt columns is never read: overwriting it changes nothing."""
    from rlvr.rollout.lean import PrefixBatch, SharedPrefixes, shared_prefix_attention

    torch.manual_seed(0)
    B, KV, G, D, L = 6, 2, 3, 4, 12
    q = torch.randn(B, KV, G, D)
    keys, values = torch.randn(B, KV, L, D), torch.randn(B, KV, L, D)
    own = torch.ones(B, L, dtype=torch.bool)
    own[:, :2] = False  # holes before every row's context
    own[[0, 3, 5], 3] = False  # group A's prompt has a hole
    own[[1, 4], 2:4] = False  # group B's prompt starts at 4
    own[2, :7] = False  # slot 2 starts at 7
    own[4, 9] = False  # a hole among one row's own columns
    for lead, members in ((0, [3, 5]), (1, [4])):
        keys[members, :, 2:7], values[members, :, 2:7] = keys[lead, :, 2:7], values[lead, :, 2:7]
    mask = torch.zeros(B, L).masked_fill_(~own, float("-inf"))[:, None, None, :]
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=0.5)

    def batch(lo, members):  # padded with the lead: B's two rows sit beside A's three
        m = 3
        padded = [rows + [rows[0]] * (m - len(rows)) for rows in members]
        real = [i * m + j for i, rows in enumerate(members) for j in range(len(rows))]
        leads = torch.tensor([rows[0] for rows in members])
        return PrefixBatch(lo, 7, torch.tensor(padded), leads, mask[leads, :, :, lo:7].clone(), torch.tensor(real),
                           torch.tensor([s for rows in members for s in rows]))

    prefixes = SharedPrefixes(7, [batch(2, [[0, 3, 5]]), batch(4, [[1, 4]])])
    got = shared_prefix_attention(q, keys, values, mask, 0.5, prefixes)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    keys[[3, 5, 4], :, 2:7] = 1e3  # the members' copies: not read
    values[[3, 5, 4], :, 2:7] = -1e3
    torch.testing.assert_close(shared_prefix_attention(q, keys, values, mask, 0.5, prefixes), want, atol=1e-6, rtol=1e-5)
    # with one batch's lead given as an evenly spaced slice (the engine's view, no copy): the same
    prefixes.batches[0].leads = slice(0, 1, 1)
    torch.testing.assert_close(shared_prefix_attention(q, keys, values, mask, 0.5, prefixes), want, atol=1e-6, rtol=1e-5)
