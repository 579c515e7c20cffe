"""The memory plan against byte counts computed by hand, its refusal, and a dry run that loads nothing."""

import json

import pytest

from rlvr import cli
from rlvr.config import ConfigError, load_config
from rlvr.trainer.memory_plan import ModelShape, check_plan, plan_memory, read_model_config

# hidden 8, 2 layers, 2 heads of dim 4, 1 kv head, intermediate 16, vocab 32, tied, no biases
TINY = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 32, "tie_word_embeddings": True}


@pytest.fixture
def tiny_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))  # config.json only, no weights
    return tmp_path


def tiny_overrides(folder):
    return [f"actor_rollout_ref.model.path={folder}", "actor_rollout_ref.actor.strategy=fsdp2", "trainer.device=cpu",
            "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.rollout.dtype=bfloat16", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.max_prompt_length=6",
            "data.max_response_length=10", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]


def test_tiny_plan_by_hand(tiny_folder):
    plan = plan_memory(load_config(None, tiny_overrides(tiny_folder)), read_model_config(str(tiny_folder)))
    # layer: q 8x8 + k,v 8x4 each = 128, o 8x8 = 64, mlp 3x8x16 = 384, 2 norms 16 -> 592
    # root: tied embedding 32x8 = 256 + final norm 8 -> 264; P = 2x592 + 264 = 1448
    assert plan.params == 1448
    b = {name: term.bytes for name, term in plan.terms.items()}
    assert b["weights"] == b["gradients"] == b["reference"] == 4 * 1448 / 2 == 2896  # fp32, sharded over 2
    assert b["optimizer"] == 5792  # 2 fp32 moments
    assert b["master"] == 0  # the parameters are fp32 themselves
    assert b["engine_weights"] == 2896  # bf16, unsharded: 2 x 1448, only while generating
    assert b["init_read"] == 5792  # the fp32 state rank 0 reads once
    # root + one layer gathered in fp32, (264 + 592) x 4 = 3424; their fp32 gradients: the tied root's head
    # part, lookup part, sum and reduce-scatter copy (4 x 264), the layer's gradient and copy (2 x 592):
    # (1056 + 1184) x 4 = 8960
    assert b["gathered"] == 3424 + 8960 == 12384
    assert b["packed_head"] == 32 * 8 * 2  # 512: the CPU decode's prepacked bf16 vocabulary projection
    # rows per rank 4 x 2 / 2 = 4; K and V: 2 x 2 layers x 1 kv head x dim 4 x 4 rows x (6 + 10) x 2 bytes
    assert plan.rows_per_rank == 4 and b["kv_cache"] == 2048
    # micro-batch 2 rows x 16 tokens = 32; (8x8 + 4x16 = 128) per token and layer x 2 layers x 4 bytes
    assert b["activations"] == 128 * 2 * 32 * 4 == 32768
    # fp32 log-softmax of 2 x 10 response tokens kept, plus two chunks in flight (20 tokens each), x vocab 32
    assert b["logits"] == 4 * 32 * (20 + 2 * 20) == 7680
    assert plan.phase_bytes("init") == 5792 + 2896 + 2896 == 11584  # the read, actor and reference shards
    # weights + reference + AdamW state + engine weights + packed head + KV = 2896 x 3 + 5792 + 512 + 2048
    assert plan.phase_bytes("generation") == 17040
    # 2896 x 3 (weights, reference, gradients) + 5792 + 32768 + 7680 + 12384: no engine weights
    assert plan.phase_bytes("update") == 67312
    assert plan.peak_phase == "update"


def test_local_strategy_keeps_its_copies(tiny_folder):
    overrides = tiny_overrides(tiny_folder) + ["actor_rollout_ref.actor.strategy=local", "trainer.n_gpus_per_node=1"]
    plan = plan_memory(load_config(None, overrides), TINY)
    b = {name: term.bytes for name, term in plan.terms.items()}
    assert b["weights"] == b["reference"] == b["gradients"] == 5792 and b["engine_weights"] == 2896  # bf16 copy
    assert "init_read" not in b and "gathered" not in b
    assert plan.phase_bytes("init") == 5792 * 2 + 2896  # the loaded model, its reference, the bf16 copy
    fp32 = plan_memory(load_config(None, overrides + ["actor_rollout_ref.rollout.dtype=float32"]), TINY)
    assert fp32.terms["engine_weights"].bytes == 0  # the engine shares the actor's weights


def test_offload_leaves_generation(tiny_folder, monkeypatch):
    import rlvr.trainer.memory_plan

    monkeypatch.setattr(rlvr.trainer.memory_plan, "on_gpu", lambda config: False)  # the packed head counts
    # offload moves GPU memory: a CPU device refuses it, so the device is left to find
    overrides = tiny_overrides(tiny_folder) + ["trainer.device=auto","actor_rollout_ref.actor.fsdp_config.param_offload=true",
                                               "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                                               "actor_rollout_ref.ref.fsdp_config.param_offload=true"]
    plan = plan_memory(load_config(None, overrides), TINY)
    assert plan.phase_bytes("generation") == 17040 - 2896 - 5792 - 2896  # no actor or reference shards, no AdamW
    assert plan.phase_bytes("update") == 67312  # all back on the device


def test_refuses_with_the_setting_to_change(tiny_folder):
    config = load_config(None, tiny_overrides(tiny_folder))
    plan = plan_memory(config, TINY)
    check_plan(plan, 67312, config)  # exactly fits
    # the update's largest term is the activations (32768 of 67312 bytes)
    with pytest.raises(ConfigError, match=r"0\.00 GB per device in update, .*activations.*"
                                          r"ppo_micro_batch_size_per_gpu.*enable_gradient_checkpointing=true"):
        check_plan(plan, 67311, config)


def test_refusal_in_generation_names_the_kv_settings(tiny_folder):
    overrides = tiny_overrides(tiny_folder) + ["data.train_batch_size=100", "actor_rollout_ref.rollout.n=8",
                                               "actor_rollout_ref.actor.ppo_mini_batch_size=100",
                                               "data.max_response_length=2000"]
    config = load_config(None, overrides)
    plan = plan_memory(config, TINY)
    # 100 prompts x 8 / 2 ranks = 400 rows x (6 + 2000) positions x 2 (K, V) x 2 layers x 1 kv head x 4 dims
    # x 2 bytes = 25,676,800, while the update's activations are 2 rows x 2006 tokens x 128 x 2 layers x 4 bytes
    # = 4,108,288 and its log-softmax 4 x 32 x (2 x 2000 + 2048) = 774,144
    assert plan.terms["kv_cache"].bytes == 400 * 2006 * 32 == 25_676_800
    assert plan.terms["activations"].bytes == 4_108_288 and plan.terms["logits"].bytes == 774_144
    assert plan.peak_phase == "generation"
    # max_num_seqs 250: waves of 31 whole groups of 8 = 248 rows
    capped = plan_memory(load_config(None, overrides + ["actor_rollout_ref.rollout.max_num_seqs=250"]), TINY)
    assert capped.terms["kv_cache"].bytes == 248 * 2006 * 32
    with pytest.raises(ConfigError, match=r"in generation, .*KV cache \(0\.03 GB\): lower "
                                          r"actor_rollout_ref\.rollout\.max_num_seqs.*data\.max_response_length$"):
        check_plan(plan, 1e6, config)


def test_qwen_7b_parameter_count():
    shape = ModelShape.from_config(read_model_config("examples/model_configs/qwen2.5-7b"))
    assert shape.params() == 7_615_616_512  # Qwen2.5-7B's published count (7.62B)
    shape = ModelShape.from_config(read_model_config("examples/model_configs/qwen2.5-0.5b"))
    assert shape.params() == 494_032_768  # Qwen2.5-0.5B's (0.49B, tied head)
    # the built-in SmolLM2-135M, without its GGUF file: 49152 x 576 tied embedding + 576 final norm
    # + 30 layers x (576 x (576 + 2 x 192) + 576 x 576 + 3 x 576 x 1536 + 2 x 576 = 3,540,096)
    assert ModelShape.from_config(read_model_config("builtin")).params() == 134_515_008


def test_dry_run_loads_no_model(tiny_folder, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("a dry run loaded a model")

    import rlvr.models.loader
    import rlvr.trainer.main
    monkeypatch.setattr(rlvr.models.loader, "load_model", refuse)
    monkeypatch.setattr(rlvr.models.loader, "load_tokenizer", refuse)
    monkeypatch.setattr(rlvr.trainer.main, "run_training", refuse)
    assert cli.main(["train", "--dry-run", "--device-memory-gb", "1", *tiny_overrides(tiny_folder)]) == 0
    assert "peak 0.00 GB in update" in capsys.readouterr().out
    assert cli.main(["plan", "--device-memory-gb", "0.00005", *tiny_overrides(tiny_folder)]) == 2
    assert "ppo_micro_batch_size_per_gpu" in capsys.readouterr().err


def test_a_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        read_model_config(str(tmp_path))


def test_gradient_checkpointing_keeps_layer_inputs(tiny_folder):
    overrides = tiny_overrides(tiny_folder) + ["actor_rollout_ref.model.enable_gradient_checkpointing=true"]
    plan = plan_memory(load_config(None, overrides), TINY)
    # layer inputs: hidden 8 x 2 layers x 32 tokens, plus one layer recomputed: 128 x 32 tokens; x 4 bytes
    assert plan.terms["activations"].bytes == (8 * 2 * 32 + 128 * 32) * 4 == 18432


def test_on_a_gpu_the_load_is_in_host_memory(tiny_folder):
    """Rank 0 reads the full state into host RAM, then broadcasts it to the devices' shards."""
    plan = plan_memory(load_config(None, tiny_overrides(tiny_folder) + ["trainer.device=cuda"]), TINY)
    assert plan.phase_bytes("init") == 2896 + 2896  # the shards only
    assert plan.terms["packed_head"].bytes == 0  # the CPU decode's packed projection: not on a GPU


def test_vllm_keeps_its_weights_and_kv_cache_on_a_cpu(tiny_folder):
    """rollout.name=vllm: its own copy of the weights and a KV cache of max_num_seqs rows x
    max_model_len positions, allocated at start and kept through the update (no sleep on a CPU)."""
    from rlvr.config import load_config
    from rlvr.trainer.memory_plan import plan_memory, read_model_config

    config = load_config(overrides=[f"actor_rollout_ref.model.path={tiny_folder}", "trainer.device=cpu",
                                    "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.max_num_seqs=4",
                                    "actor_rollout_ref.rollout.max_model_len=200"])
    plan = plan_memory(config, read_model_config(str(tiny_folder)))
    # K and V x 2 layers x 1 kv head x dim 4 x 4 rows x 200 positions x 4 bytes = 51,200
    assert plan.terms["kv_cache"].bytes == 51_200
    assert plan.terms["engine_weights"].bytes == 4 * plan.params  # an fp32 copy of every parameter
    for phase in ("init", "generation", "update"):
        assert {"engine_weights", "kv_cache"} <= set(plan.phases[phase]), phase
