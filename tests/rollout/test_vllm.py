"""rollout.name=vllm: vLLM (its CPU build) in this process, on the built-in model.

One engine serves the module (a start takes seconds; rollouts over other policies share it and
must each reload their own weights). The expected values come from transformers' forward and
``generate`` on the same weights, and from rlvr's native engine, never from vLLM itself.
"""

import copy

import pytest
import torch

from rlvr.config.schema import RolloutConfig
from rlvr.data import left_pad
from rlvr.protocol import DataProto
from rlvr.rollout import NativeRollout, SamplingParams, VLLMRollout, get_rollout_class
from rlvr.rollout.vllm_rollout import policy_weights, request_seed

QUESTIONS = ["What is 2+3?", "Name a colour.", "Count to five.", "Say hi in French.", "What is 7 times 6?",
             "Is the sky blue?"]
LOGPROB_TOL = 2e-3  # fp32 on both sides; vLLM's CPU kernels sum in another order than transformers' SDPA


def prompt_ids(tokenizer, questions=QUESTIONS):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for q in questions]


@pytest.fixture(scope="module")
def policy(builtin_dir):
    from rlvr.models import load_model, load_tokenizer

    return load_model(builtin_dir), load_tokenizer(builtin_dir)


def vllm_engine(model, tokenizer, **config):
    engine = VLLMRollout(model, tokenizer, RolloutConfig(name="vllm", max_num_seqs=32, **config),
                         max_response_length=32, max_prompt_length=96)
    engine.sync_weights()
    return engine


@pytest.fixture(scope="module")
def engine(policy):
    import os

    before = dict(os.environ)
    engine = vllm_engine(*policy)
    # starting vLLM sets LD_PRELOAD, LOCAL_WORLD_SIZE, ... in os.environ: processes started later
    # (Ray workers, ranks, the sandbox) must not inherit them. Only vLLM's own keys may stay.
    changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
    assert all(k.startswith("VLLM_") for k in changed), sorted(changed)
    return engine


def transformers_greedy(model, tokenizer, ids, max_new_tokens, eos_ids):
    input_ids, mask, _ = left_pad(ids, tokenizer.pad_token_id)
    out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                         eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)[:, input_ids.shape[1]:]
    return [row[:next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))] for row in out.tolist()]


def forward_log_probs(model, prompt, response, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(response)])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_registry_names_the_engines():
    assert get_rollout_class("vllm") is VLLMRollout and get_rollout_class("native") is NativeRollout
    with pytest.raises(ValueError, match="registered: \\['native', 'vllm'\\]"):
        get_rollout_class("sglang")


def test_greedy_tokens_equal_transformers_greedy(engine, policy):
    model, tokenizer = policy
    ids = prompt_ids(tokenizer)
    got = engine.generate(ids, SamplingParams(max_new_tokens=32, do_sample=False))
    assert [c.token_ids for c in got] == transformers_greedy(model, tokenizer, ids, 32, engine.eos_ids)
    assert any(c.finish_reason == "stop" and c.token_ids[-1] in engine.eos_ids for c in got)  # EOS kept, as native
    assert any(c.finish_reason == "length" and len(c.token_ids) == 32 for c in got)


def test_a_stale_engine_is_impossible(engine, policy):
    """After an update the engine samples the new weights: its greedy tokens equal transformers'
    greedy tokens under the new weights, which differ from those under the old ones."""
    model, tokenizer = policy
    ids = prompt_ids(tokenizer)[:3]
    params = SamplingParams(max_new_tokens=12, do_sample=False)
    updated = copy.deepcopy(model)
    with torch.no_grad():  # an "update": the last layer's MLP output scaled, enough to change greedy tokens
        updated.model.layers[-1].mlp.down_proj.weight.mul_(-3.0)
    old = transformers_greedy(model, tokenizer, ids, 12, engine.eos_ids)
    new = transformers_greedy(updated, tokenizer, ids, 12, engine.eos_ids)
    assert old != new  # else the test could not tell stale weights from fresh ones

    other = VLLMRollout(updated, tokenizer, engine.config, 32, 96)
    assert other.llm is engine.llm  # the same engine, now owned by another policy
    other.sync_weights(version=7)
    assert [c.token_ids for c in other.generate(ids, params)] == new
    before = other.syncs
    other.sync_weights(version=7)  # the engine holds version 7 of this policy: nothing to send
    assert other.syncs == before
    engine.sync_weights(version=7)  # same version number, but another policy's weights: reloaded
    assert [c.token_ids for c in engine.generate(ids, params)] == old


def test_rollout_log_probs_equal_the_actors_forward(engine, policy):
    """The sampled tokens' log-probs under softmax(logits / T) agree with the actor's forward pass
    within LOGPROB_TOL (the trainer's rollout_probs_diff metrics and rollout correction use them)."""
    model, tokenizer = policy
    ids = prompt_ids(tokenizer)[:4]
    for temperature in (1.0, 0.7):
        got = engine.generate(ids, SamplingParams(max_new_tokens=16, temperature=temperature, seed=3))
        for prompt, c in zip(ids, got):
            expected = forward_log_probs(model, prompt, c.token_ids, temperature)
            assert torch.allclose(torch.tensor(c.log_probs), expected, atol=LOGPROB_TOL), temperature


def test_seeded_rows_are_reproducible_and_independent_of_the_split(engine, policy):
    """A row's tokens depend on the seed and its row in the whole batch: the batch at once equals
    two ranks' halves (row_offset), and another seed draws other tokens."""
    _, tokenizer = policy
    ids = [p for p in prompt_ids(tokenizer)[:2] for _ in range(4)]  # 2 groups of n = 4
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11, total_rows=8)
    whole = [c.token_ids for c in engine.generate(ids, params)]
    assert whole == [c.token_ids for c in engine.generate(ids, params)]
    halves = [c.token_ids for c in engine.generate(ids[:4], params)] + \
        [c.token_ids for c in engine.generate(ids[4:], SamplingParams(max_new_tokens=12, temperature=1.0, seed=11,
                                                                      row_offset=4, total_rows=8))]
    assert halves == whole
    assert len({tuple(t) for t in whole[:4]}) > 1  # a group's rows draw different samples
    other = [c.token_ids for c in engine.generate(ids, SamplingParams(max_new_tokens=12, temperature=1.0, seed=12))]
    assert other != whole
    assert request_seed(11, 0, 30) != request_seed(11, 1, 30) != request_seed(11, 1, 31)


def test_generate_sequences_layout_equals_the_native_engines(engine, policy):
    """Greedy, with a stop string: the same DataProto as the native engine (tokens, masks,
    positions exactly; rollout log-probs within LOGPROB_TOL), so everything downstream is unchanged."""
    model, tokenizer = policy
    ids = prompt_ids(tokenizer)
    input_ids, mask, positions = left_pad(ids, tokenizer.pad_token_id)
    batch = DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": positions})
    batch.meta_info.update(do_sample=False, stop=["five", "."])
    native = NativeRollout(model, tokenizer, engine.config, max_response_length=32).generate_sequences(batch)
    out = engine.generate_sequences(batch)
    assert sorted(out.batch.keys()) == sorted(native.batch.keys())
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids", "prompts"):
        assert torch.equal(out.batch[key], native.batch[key]), key
    assert list(out.non_tensor_batch["finish_reason"]) == list(native.non_tensor_batch["finish_reason"])
    assert "stop" in set(out.non_tensor_batch["finish_reason"])  # a stop string ended some row
    assert torch.allclose(out.batch["rollout_log_probs"], native.batch["rollout_log_probs"], atol=LOGPROB_TOL)


def test_lora_weights_are_sent_merged(policy):
    """A peft LoRA actor sends W + scale * B A under the plain names, and no adapter matrices."""
    from rlvr.models.lora import apply_lora, unwrap

    model, _ = policy
    lora = apply_lora(copy.deepcopy(model), 4, 8, ["q_proj"])
    layer = unwrap(lora).model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.fill_(0.5)  # peft starts B at 0: make the delta non-zero
    sent = dict(policy_weights(unwrap(lora)))
    expected = layer.base_layer.weight + 2.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    assert torch.allclose(sent["model.layers.0.self_attn.q_proj.weight"], expected)
    assert set(sent) == set(model.state_dict())  # the plain model's names (the tied head too)


def test_a_lora_actor_samples_its_merged_weights(engine, policy):
    """A LoRA actor's rollout samples base + adapter: vLLM's greedy tokens equal the peft model's
    greedy tokens, which differ from the base model's."""
    from rlvr.models.lora import apply_lora, unwrap

    model, tokenizer = policy
    ids = prompt_ids(tokenizer)[:3]
    lora = apply_lora(copy.deepcopy(model), 8, 16, ["q_proj", "v_proj", "down_proj"])
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # peft starts B at 0; a trained adapter does not
    expected = transformers_greedy(lora, tokenizer, ids, 12, engine.eos_ids)
    assert expected != transformers_greedy(model, tokenizer, ids, 12, engine.eos_ids)
    rollout = VLLMRollout(unwrap(lora), tokenizer, engine.config, 32, 96)
    rollout.sync_weights(version=0)
    assert [c.token_ids for c in rollout.generate(ids, SamplingParams(max_new_tokens=12, do_sample=False))] == expected
    # the module's engine gets its own weights back before it generates again
    assert [c.token_ids for c in engine.generate(ids, SamplingParams(max_new_tokens=12, do_sample=False))] == \
        transformers_greedy(model, tokenizer, ids, 12, engine.eos_ids)


def test_the_one_row_kv_floor_is_whole_blocks(tiny_vllm_model_dir, monkeypatch):
    """Below ``CPU_KV_CACHE_CAP`` the cache keeps one row of max_model_len in whole blocks of
    vLLM's CPU block size, plus the block its pool holds back: 130 tokens at 128 per block are
    2 blocks + 1 = 384 tokens. vLLM starts on that floor (on a floor of 130 tokens' bytes its
    start fails: "To serve at least one request with the model's max seq len (130) ...")."""
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import vllm_rollout

    assert vllm_rollout.cpu_kv_cache_bytes(10, 4, 130) == 10 * 130 * 4  # under the cap: 4 rows
    monkeypatch.setattr(vllm_rollout, "CPU_KV_CACHE_CAP", 1)
    assert vllm_rollout.cpu_kv_cache_bytes(10, 4, 130) == 10 * 384
    assert vllm_rollout.cpu_kv_cache_bytes(10, 4, 256) == 10 * 384  # 2 blocks exactly, + 1
    model, tokenizer = load_model(tiny_vllm_model_dir), load_tokenizer(tiny_vllm_model_dir)
    rollout = VLLMRollout(model, tokenizer, RolloutConfig(name="vllm", max_num_seqs=4, max_model_len=130),
                          max_response_length=120)
    assert rollout.llm.llm_engine.vllm_config.cache_config.block_size == vllm_rollout.CPU_BLOCK_SIZE
    rollout.sync_weights()
    (done,) = rollout.generate([[1, 2, 3]], SamplingParams(max_new_tokens=127, do_sample=False))
    assert 1 <= len(done.token_ids) <= 127


def embedding_lora(model, targets=("embed_tokens",)):
    """``model`` with a random non-zero LoRA adapter on ``targets`` (peft starts the embedding's
    A and a linear layer's B at 0)."""
    from rlvr.models.lora import apply_lora

    lora = apply_lora(copy.deepcopy(model), 4, 8, list(targets))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_embedding_A" in name or "lora_B" in name:
                p.normal_(0, 0.5)
    return lora


def test_an_embedding_lora_is_sent_merged_and_the_tied_head_is_not(policy):
    """The embedding's adapter (peft's lora_embedding_A/B) is merged into embed_tokens; the tied
    head keeps the base weight, as in the peft model (the adapter adapts the embedding alone)."""
    from rlvr.models.lora import unwrap

    model, _ = policy
    lora = unwrap(embedding_lora(model))
    layer = lora.model.embed_tokens
    sent = dict(policy_weights(lora))
    delta = 2.0 * (layer.lora_embedding_B["default"] @ layer.lora_embedding_A["default"]).T  # scale alpha/r = 8/4
    assert delta.abs().max() > 0
    assert torch.allclose(sent["model.embed_tokens.weight"], layer.base_layer.weight + delta)
    assert torch.equal(sent["lm_head.weight"], layer.base_layer.weight)
    assert set(sent) == set(model.state_dict())


def test_an_embedding_lora_actor_samples_its_adapted_embedding(tiny_vllm_model_dir):
    """vLLM's greedy tokens equal the peft model's (adapter on embed_tokens and q_proj), not the
    base model's: the merge used to skip the embedding's adapter."""
    from rlvr.models import load_model, load_tokenizer
    from rlvr.models.lora import unwrap

    model, tokenizer = load_model(tiny_vllm_model_dir), load_tokenizer(tiny_vllm_model_dir)
    lora = embedding_lora(model, ("embed_tokens", "q_proj"))
    ids = prompt_ids(tokenizer)[:3]
    rollout = VLLMRollout(unwrap(lora), tokenizer, RolloutConfig(name="vllm", max_num_seqs=8), 32, 96)
    expected = transformers_greedy(lora, tokenizer, ids, 12, rollout.eos_ids)
    assert expected != transformers_greedy(model, tokenizer, ids, 12, rollout.eos_ids)
    rollout.sync_weights(version=0)
    assert [c.token_ids for c in rollout.generate(ids, SamplingParams(max_new_tokens=12, do_sample=False))] == expected


@pytest.mark.slow
def test_a_mixture_of_experts_samples_its_updated_experts(tiny_moe_model_dir):
    """Qwen3-MoE under transformers 5 holds its experts fused (mlp.experts.gate_up_proj); vLLM
    loads them per expert. After an update of the experts alone, vLLM's greedy tokens equal
    transformers' under the new weights (which differ from the old ones). Before, the stream
    sent the fused names, and on the CPU the reloaded experts were not packed for the kernel.
    In a process of its own: vLLM makes its expert-parallel group only if the process's first
    engine is a mixture of experts (this module's engines are dense)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import rlvr

    script = Path(__file__).with_name("vllm_moe_check.py")
    env = {**os.environ, "PYTHONPATH": str(Path(rlvr.__file__).parents[1])}  # the rlvr under test
    done = subprocess.run([sys.executable, str(script), str(tiny_moe_model_dir)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["new_differs_from_old"]  # else the test could not tell stale experts from fresh ones
    assert facts["vllm_equals_transformers"] == {"before the update": True, "after the update": True}


# ---------------------------------------------------------------- families: what the stream sends, what vLLM takes
def tiny_family(family: str, **extra):
    """A tiny random model of ``family`` built by transformers (64-wide heads: vLLM's CPU attention)."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    shape = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64, max_position_embeddings=256, pad_token_id=0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIG_MAPPING[family](**{**shape, **extra})).eval()


def test_persistent_buffers_are_sent_with_the_parameters():
    """GLM-4-MoE's router keeps e_score_correction_bias as a buffer (vLLM: a parameter): the stream
    sends every persistent buffer (what a checkpoint stores), not the rotary tables (non-persistent)."""
    model = tiny_family("glm4_moe", moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    with torch.no_grad():
        bias.copy_(torch.tensor([0.5, -1.0, 2.0, 0.25]))
    sent = dict(policy_weights(model))
    assert torch.equal(sent["model.layers.1.mlp.gate.e_score_correction_bias"], bias)
    assert not any("inv_freq" in name for name in sent)


def test_a_tied_head_is_sent_only_to_an_engine_that_has_one():
    """vLLM's Gemma-2 computes its logits from embed_tokens and has no lm_head parameter: the tied
    alias is not sent to it (its reload fails on the unknown name); vLLM's Llama ties a head of its own
    to the embedding and reloads it layer by layer, so it gets the alias."""
    from rlvr.rollout.vllm_rollout import engine_has_head

    model = tiny_family("gemma2")
    assert model.config.tie_word_embeddings
    with_head, without = dict(policy_weights(model)), dict(policy_weights(model, tied_head=False))
    assert set(with_head) - set(without) == {"lm_head.weight"}
    assert torch.equal(without["model.embed_tokens.weight"], model.model.embed_tokens.weight)

    class Engine(torch.nn.Module):  # vLLM's layouts, as named_parameters shows them
        def __init__(self, head: bool):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.embed_tokens = torch.nn.Embedding(4, 2)
            if head:
                self.lm_head = torch.nn.Linear(2, 4, bias=False)
                self.lm_head.weight = self.model.embed_tokens.weight  # tied: listed under both names

    assert engine_has_head(Engine(head=True)) and not engine_has_head(Engine(head=False))


def test_kv_size_of_per_layer_head_dims():
    """Gemma-4 gives its full-attention layers global_head_dim and its sliding layers head_dim; its
    config answers head_dim only per layer (config.head_dim raises)."""
    from transformers import CONFIG_MAPPING

    from rlvr.rollout.vllm_rollout import kv_bytes_per_token

    config = CONFIG_MAPPING["gemma4_text"](vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                                           num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                                           global_head_dim=64,
                                           hidden_size_per_layer_input=4, vocab_size_per_layer_input=64,
                                           layer_types=["sliding_attention", "full_attention"] * 2)
    # 2 sliding layers x 2 kv heads x 32 + 2 full layers x 2 kv heads x 64 = 384 values, keys and values
    # (x 2), 4 bytes: 3072 bytes a token (one head_dim of 32 for all would give 1024 x 2, of 64 4096)
    assert kv_bytes_per_token(config, torch.float32) == 2 * (2 * 2 * 32 + 2 * 2 * 64) * 4 == 3072
    # and a plain config: 2 layers x 1 kv head x 64 x 2 x 4 bytes
    assert kv_bytes_per_token(tiny_family("llama").config, torch.float32) == 2 * 2 * 64 * 4


@pytest.mark.parametrize("family, architecture", [("olmo2", "Olmo2ForCausalLM"), ("olmo3", "Olmo3ForCausalLM"),
                                                  ("smollm3", "SmolLM3ForCausalLM")])
def test_a_family_vllm_runs_through_its_transformers_backend_is_refused_at_load(family, architecture, tokenizer):
    """vLLM 0.32 has no implementation of its own for these (its registry maps them to its
    transformers backend): refused before the engine starts, naming the family and what to use."""
    from rlvr.config import ConfigError

    model = tiny_family(family, architectures=[architecture])
    with pytest.raises(ConfigError, match=f"{architecture} \\(model_type '{family}'\\).*rollout.name=native"):
        VLLMRollout(model, tokenizer, RolloutConfig(name="vllm", max_num_seqs=4), 16, 32)
    # without architectures in the config, the model's class names it
    bare = tiny_family(family)
    with pytest.raises(ConfigError, match=architecture):
        VLLMRollout(bare, tokenizer, RolloutConfig(name="vllm", max_num_seqs=4), 16, 32)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["glm4_moe", "gemma2"])
def test_a_familys_greedy_tokens_equal_transformers_after_the_sync(family, builtin_dir):
    """After one sync vLLM's greedy tokens equal transformers' on a tiny GLM-4-MoE (its router's
    e_score_correction_bias, a buffer, moved off vLLM's dummy values) and a tiny Gemma-2 (a tied head,
    which vLLM's Gemma-2 has no parameter for: the sync used to fail on lm_head.weight). In a process
    of its own (``vllm_family_check.py``): vLLM's first engine in a process fixes its expert-parallel
    group."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import rlvr

    script = Path(__file__).with_name("vllm_family_check.py")
    env = {**os.environ, "PYTHONPATH": str(Path(rlvr.__file__).parents[1])}  # the rlvr under test
    done = subprocess.run([sys.executable, str(script), family, str(builtin_dir)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"vllm_equals_transformers": True}


def test_seeded_prompts_past_one_steps_token_budget_are_prefilled_whole(policy):
    """vLLM's CPU build fails a seeded request whose prompt a step prefills in part ("CPU Generator
    does not use offset"); it splits prompts when a step's pass max_num_batched_tokens (64 rows of
    the calculator task's 200-token prompts did at its default, 4096). Here 16 seeded rows of ~35
    tokens pass a budget of 128: each prompt is prefilled whole, the rollout completes, and it
    repeats. A budget below max_model_len is refused at load, naming the key."""
    model, tokenizer = policy
    engine = vllm_engine(model, tokenizer, max_num_batched_tokens=128)  # max_model_len 96 + 32
    ids = [p for p in prompt_ids(tokenizer)[:4] for _ in range(4)]
    assert sum(len(p) for p in ids) > 128
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    first = [c.token_ids for c in engine.generate(ids, params)]
    assert all(first) and first == [c.token_ids for c in engine.generate(ids, params)]
    with pytest.raises(ValueError, match="max_num_batched_tokens = 64 is less than max_model_len 128"):
        vllm_engine(model, tokenizer, max_num_batched_tokens=64)


def test_a_rollout_workers_engine_is_sized_by_prompt_and_response(tiny_vllm_model_dir, monkeypatch):
    """A rollout of its own (hybrid_engine=false, trainer.v1 colocate_async: a RolloutWorker) sizes
    vLLM's context as the hybrid worker and the load check do, data.max_prompt_length +
    data.max_response_length (the recipe's 128 + 64), not the model's max_position_embeddings (the
    worker passed no prompt length). vLLM's constructor is a recording stand-in."""
    from types import SimpleNamespace

    from rlvr.config import load_config
    from rlvr.rollout import vllm_rollout
    from rlvr.workers.rollout import RolloutWorker

    started = []
    monkeypatch.setattr(vllm_rollout, "_ENGINES", {})
    monkeypatch.setattr(vllm_rollout, "_start_engine",
                        lambda config, tokenizer, args, device: started.append(args) or SimpleNamespace())
    config = load_config(overrides=[f"actor_rollout_ref.model.path={tiny_vllm_model_dir}",
                                    "actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu"])
    worker = RolloutWorker(config)
    worker.init_model()
    longest = config.data.max_prompt_length + config.data.max_response_length
    assert longest == 192 != worker.model.config.max_position_embeddings
    assert started[0]["max_model_len"] == longest and worker.rollout.max_model_len == longest
