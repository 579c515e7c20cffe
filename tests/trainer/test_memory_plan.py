"""The memory plan against byte counts computed by hand, its refusal, and a dry run that loads nothing."""

import json
from dataclasses import replace

import pytest

from rlvr import cli
from rlvr.config import ConfigError, load_config
from rlvr.trainer.memory_plan import ModelShape, check_plan, format_plan, plan_memory, read_model_config

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
    # the CPU decode's prepacked bf16 projections: each layer's q, k, v, o and MLP (128 + 64 + 384 = 576)
    # x 2 layers + the vocabulary's 32 x 8 = 256 -> 1408 x 2 bytes
    assert b["packed_weights"] == (2 * 576 + 256) * 2 == 2816
    # rows per rank 4 x 2 / 2 = 4; K and V: 2 x 2 layers x 1 kv head x dim 4 x 4 rows x (6 + 10) x 2 bytes
    assert plan.rows_per_rank == 4 and b["kv_cache"] == 2048
    # micro-batch 2 rows x 16 tokens = 32; (8x8 + 4x16 = 128) per token and layer x 2 layers x 4 bytes
    assert b["activations"] == 128 * 2 * 32 * 4 == 32768
    # fp32 log-softmax of 2 x 10 response tokens kept, plus two chunks in flight (20 tokens each), x vocab 32
    assert b["logits"] == 4 * 32 * (20 + 2 * 20) == 7680
    assert plan.phase_bytes("init") == 5792 + 2896 + 2896 == 11584  # the read, actor and reference shards
    # weights + reference + AdamW state + engine weights + packed projections + KV = 2896 x 3 + 5792 + 2816 + 2048
    assert plan.phase_bytes("generation") == 19344
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

    monkeypatch.setattr(rlvr.trainer.memory_plan, "on_gpu", lambda config: False)  # the packed projections count
    # offload moves GPU memory: a CPU device refuses it (auto on this CPU too), so the plan is a GPU's
    overrides = tiny_overrides(tiny_folder) + ["trainer.device=cuda", "actor_rollout_ref.actor.dtype=float32",
                                               "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=float32",
                                               "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                                               "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                                               "actor_rollout_ref.ref.fsdp_config.param_offload=true"]
    plan = plan_memory(load_config(None, overrides), TINY)
    assert plan.phase_bytes("generation") == 19344 - 2896 - 5792 - 2896  # no actor or reference shards, no AdamW
    assert plan.phase_bytes("update") == 67312  # all back on the device


def test_refuses_with_the_setting_to_change(tiny_folder):
    config = load_config(None, tiny_overrides(tiny_folder))
    plan = plan_memory(config, TINY)
    check_plan(replace(plan, capacity=67312), config)  # exactly fits
    # the update's largest term is the activations (32768 of 67312 bytes)
    with pytest.raises(ConfigError, match=r"0\.00 GB per device in update, .*activations.*"
                                          r"ppo_micro_batch_size_per_gpu.*enable_gradient_checkpointing=true"):
        check_plan(replace(plan, capacity=67311), config)


def test_refusal_in_generation_names_the_kv_settings(tiny_folder):
    overrides = tiny_overrides(tiny_folder) + ["data.train_batch_size=100", "actor_rollout_ref.rollout.n=8",
                                               "actor_rollout_ref.actor.ppo_mini_batch_size=100",
                                               "data.max_response_length=2000"]
    config = load_config(None, overrides)
    plan = plan_memory(config, TINY)
    # 100 prompts x 8 / 2 ranks = 400 rows x (6 + 2000) positions x 2 (K, V) x 2 layers x 1 kv head x 4 dims
    # x 2 bytes = 25,676,800, while the update's activations are 2 rows x 2006 tokens x 128 x 2 layers x 4 bytes
    # = 4,108,288; its 4000 response tokens are over one chunk of 1024, so only a chunk's logits and
    # log-softmax are alive at once (recomputed in the backward): 4 x 32 x 2 x 1024 = 262,144
    assert plan.terms["kv_cache"].bytes == 400 * 2006 * 32 == 25_676_800
    assert plan.terms["activations"].bytes == 4_108_288 and plan.terms["logits"].bytes == 262_144
    assert plan.peak_phase == "generation"
    # max_num_seqs 250: at most 250 rows run at once (a group waits for its rows, a finished row's slot
    # goes to the next waiting one)
    capped = plan_memory(load_config(None, overrides + ["actor_rollout_ref.rollout.max_num_seqs=250"]), TINY)
    assert capped.terms["kv_cache"].bytes == 250 * 2006 * 32
    with pytest.raises(ConfigError, match=r"in generation, .*KV cache \(0\.03 GB\): lower "
                                          r"actor_rollout_ref\.rollout\.max_num_seqs.*data\.max_response_length$"):
        check_plan(replace(plan, capacity=1e6), config)


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
    plan = plan_memory(load_config(None, tiny_overrides(tiny_folder) + ["trainer.device=cuda"]), TINY, 80)
    assert plan.phase_bytes("init") == 2896 + 2896  # the shards only
    assert plan.terms["packed_weights"].bytes == 0  # the CPU decode's packed projections: not on a GPU


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


def shape_of(name):
    return ModelShape.from_config(read_model_config(f"examples/model_configs/{name}"))


def test_mixture_of_experts_counts_every_expert():
    """Published totals, counted by hand from each config.json (each also equals the count of
    transformers' model built on the meta device from the same config)."""
    # Mixtral-8x7B: attention 4096 x 4096 (q) + 2 x 4096 x 1024 (k, v) + 4096 x 4096 (o) = 41,943,040;
    # 8 experts x 3 x 4096 x 14336 = 1,409,286,144; router 4096 x 8 = 32,768; 2 norms 8,192
    # -> 1,451,270,144 a layer x 32 = 46,440,644,608; + embedding and head 2 x 32000 x 4096 + norm 4096
    # = 262,148,096 -> 46,702,792,704 (46.7B; read as one dense MLP: 7.24B)
    assert shape_of("mixtral-8x7b").params() == 46_702_792_704
    # Qwen3-30B-A3B: attention 2048 x 4096 + 2 x 2048 x 512 + 4096 x 2048 = 18,874,368, q/k norms 2 x 128;
    # 128 experts x 3 x 2048 x 768 = 603,979,776; router 2048 x 128 = 262,144; 2 norms 4,096
    # -> 623,120,640 x 48 = 29,909,790,720; + 2 x 151936 x 2048 + 2048 = 622,331,904 -> 30,532,122,624 (30.5B)
    assert shape_of("qwen3-30b-a3b").params() == 30_532_122_624
    # Qwen1.5-MoE-A2.7B (qwen2_moe): attention 4 x 2048^2 + q/k/v biases 3 x 2048 = 16,783,360;
    # 60 experts x 3 x 2048 x 1408 = 519,045,120; shared expert 3 x 2048 x 5632 = 34,603,008 and its gate 2048;
    # router 2048 x 60 = 122,880; norms 4,096 -> 570,560,512 x 24 = 13,693,452,288; + 622,331,904 (as above)
    # -> 14,315,784,192 (14.3B)
    assert shape_of("qwen1.5-moe-a2.7b").params() == 14_315_784_192
    # OLMoE-1B-7B: attention 4 x 2048^2 = 16,777,216 + q/k norms over all heads 2 x 2048; 64 experts of
    # intermediate_size 1024: 64 x 3 x 2048 x 1024 = 402,653,184; router 131,072; norms 4,096
    # -> 419,569,664 x 16 = 6,713,114,624; + 2 x 50304 x 2048 + 2048 = 206,047,232 -> 6,919,161,856 (6.9B)
    assert shape_of("olmoe-1b-7b").params() == 6_919_161_856


def test_deepseek_latent_attention_and_dense_first_layers():
    # DeepSeek-V3, multi-head latent attention: q_a 7168 x 1536 = 11,010,048 + its norm 1536
    # + q_b 1536 x 128 x (128 + 64) = 37,748,736; kv_a 7168 x (512 + 64) = 4,128,768 + its norm 512
    # + kv_b 512 x 128 x (128 + 128) = 16,777,216; o 128 x 128 x 7168 = 117,440,512 -> 187,107,328; 2 norms 14,336.
    # 3 dense layers (first_k_dense_replace): + 3 x 7168 x 18432 = 396,361,728 -> 583,483,392 each;
    # 58 sparse: 256 experts x 3 x 7168 x 2048 = 11,274,289,152 + 1 shared 44,040,192 + router 256 x 7168
    # = 1,835,008 -> 11,507,286,016 each (the router's score-correction bias is a buffer, not trained).
    # 3 x 583,483,392 + 58 x 11,507,286,016 = 669,173,039,104; + 2 x 129280 x 7168 + 7168 = 1,853,365,248
    # -> 671,026,404,352 (671B)
    assert shape_of("deepseek-v3").params() == 671_026_404_352
    # DeepSeek-V2-Lite: no q_lora_rank: q 2048 x 16 x 192 = 6,291,456; kv_a 2048 x 576 = 1,179,648 + 512;
    # kv_b 512 x 16 x 256 = 2,097,152; o 2048 x 2048 = 4,194,304 -> 13,763,072; norms 4,096. 1 dense layer
    # 3 x 2048 x 10944 = 67,239,936; 26 sparse: 64 x 3 x 2048 x 1408 = 553,648,128 + 2 shared 17,301,504
    # + router 131,072. 81,007,104 + 26 x 584,847,872 + 2 x 102400 x 2048 + 2048 = 15,706,484,224 (15.7B)
    assert shape_of("deepseek-v2-lite").params() == 15_706_484_224


def test_qwen3_counts_its_query_and_key_norms():
    # Qwen3-1.7B: attention 2048 x 2048 + 2 x 2048 x 1024 + 2048 x 2048 = 12,582,912 + q/k norms 2 x 128;
    # MLP 3 x 2048 x 6144 = 37,748,736; 2 norms 4,096 -> 50,336,000 x 28 = 1,409,408,000;
    # tied embedding 151936 x 2048 + norm 2048 = 311,166,976 -> 1,720,574,976
    assert shape_of("qwen3-1.7b").params() == 1_720_574_976


def test_an_unknown_mixture_of_experts_is_refused():
    jamba = {**TINY, "model_type": "jamba", "num_experts": 16, "num_experts_per_tok": 2}
    with pytest.raises(ConfigError, match=r"cannot count model_type 'jamba'.*mixtral, qwen2_moe"):
        ModelShape.from_config(jamba)


# verl's examples/grpo_trainer/run_qwen3-1.7b.sh on 8 x 80 GB, its paths changed and its keys as rlvr reads them
QWEN3_1_7B_VERL = ["actor_rollout_ref.model.path=examples/model_configs/qwen3-1.7b", "trainer.device=cuda",
                   "trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.strategy=fsdp2",
                   "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
                   "data.train_batch_size=1024", "actor_rollout_ref.rollout.n=5", "data.max_prompt_length=512",
                   "data.max_response_length=1024", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
                   "actor_rollout_ref.actor.use_kl_loss=true",
                   "actor_rollout_ref.model.enable_gradient_checkpointing=true"]


def plan_of(overrides, device_memory_gb=None):
    config = load_config(None, overrides)
    return plan_memory(config, read_model_config(config.actor_rollout_ref.model.path), device_memory_gb)


def test_vllm_on_a_gpu_reserves_its_fraction_of_the_device():
    plan = plan_of(QWEN3_1_7B_VERL, 80)
    b = {name: term.bytes for name, term in plan.terms.items()}
    # vLLM reserves 0.6 x 80 GB = 48 GB while awake: its bf16 weights 2 x 1,720,574,976 = 3,441,149,952
    # and the KV cache and workspace in the other 44,558,850,048
    assert b["engine_weights"] == 3_441_149_952
    assert b["engine_weights"] + b["kv_cache"] == pytest.approx(48e9)
    # generation: the actor's fp32 shard 4 x 1,720,574,976 / 8 = 860,287,488, the reference's and the AdamW
    # moments (2 x) = 4 x 860,287,488 = 3,441,149,952, beside the whole reservation
    assert plan.phase_bytes("generation") == pytest.approx(3_441_149_952 + 48e9)
    assert plan.phase_bytes("init") == pytest.approx(2 * 860_287_488 + 48e9)  # the engine starts awake
    # free_cache_engine (default): vLLM sleeps at level 2 for the update, which holds none of it
    assert not {"engine_weights", "kv_cache"} & set(plan.phases["update"])
    awake = plan_of(QWEN3_1_7B_VERL + ["actor_rollout_ref.rollout.free_cache_engine=false"], 80)
    assert awake.phase_bytes("update") == pytest.approx(plan.phase_bytes("update") + 48e9)
    # gpu_memory_utilization unset: vLLM's 0.5 as rlvr passes it, 40 GB of 80
    default = plan_of([o for o in QWEN3_1_7B_VERL if "gpu_memory_utilization" not in o], 80)
    assert default.terms["engine_weights"].bytes + default.terms["kv_cache"].bytes == pytest.approx(40e9)
    check_plan(plan, load_config(None, QWEN3_1_7B_VERL))  # fits 80 GB
    # 0.99 x 80 = 79.2 GB beside the actor's 3.44 GB of shards, reference and moments: over 80 GB
    greedy = QWEN3_1_7B_VERL + ["actor_rollout_ref.rollout.gpu_memory_utilization=0.99"]
    with pytest.raises(ConfigError, match=r"82\.64 GB per device in (resume|generation).*vLLM's KV cache and "
                                          r"workspace.*lower actor_rollout_ref\.rollout\.gpu_memory_utilization"):
        check_plan(plan_of(greedy, 80), load_config(None, greedy))


def test_a_vllm_reservation_without_room_for_its_kv_cache_is_refused():
    # 0.04 x 80 GB = 3.2 GB, less than vLLM's 3.44 GB of bf16 weights: vLLM would not start
    overrides = QWEN3_1_7B_VERL + ["actor_rollout_ref.rollout.gpu_memory_utilization=0.04"]
    plan = plan_of(overrides, 80)
    assert plan.terms["kv_cache"].bytes == pytest.approx(3.2e9 - 3_441_149_952)
    with pytest.raises(ConfigError, match=r"vLLM would refuse to start.*raise actor_rollout_ref\.rollout\."
                                          r"gpu_memory_utilization"):
        check_plan(plan, load_config(None, overrides))


def vllm_on_a_cpu(folder):
    return [f"actor_rollout_ref.model.path={folder}", "trainer.device=cpu", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.max_num_seqs=4",
            "actor_rollout_ref.rollout.max_model_len=200"]


def test_vllm_on_a_cpu_with_gpu_memory_utilization_takes_that_fraction_of_the_host(tiny_folder, monkeypatch):
    """vLLM's CPU worker: KV cache = utilization x the host's memory - the process's memory when it
    starts (cpu_worker.determine_available_memory); rlvr's 1 GiB cap applies only without the key."""
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    overrides = vllm_on_a_cpu(tiny_folder) + ["actor_rollout_ref.rollout.gpu_memory_utilization=0.5"]
    plan = plan_of(overrides, 10)
    # 0.5 x 10 GB, less the actor's fp32 weights 4 x 1448 = 5792, the reference's and vLLM's fp32 copy
    assert plan.terms["kv_cache"].bytes == 5e9 - 3 * 5792
    # VLLM_CPU_KVCACHE_SPACE (GiB), when set, sizes it instead (vllm/platforms/cpu.py)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert plan_of(overrides, 10).terms["kv_cache"].bytes == 3 * 2**30
    # 0.5 x 10 kB cannot even hold the weights: vLLM raises, and so does the plan
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    with pytest.raises(ConfigError, match="vLLM would refuse to start"):
        check_plan(plan_of(overrides, 1e-5), load_config(None, overrides))


def test_vllm_needs_one_row_of_kv_cache_and_caches_deepseeks_latent():
    """vLLM starts only with room for one max_model_len row; for DeepSeek's latent attention a token's
    row is the kv_lora_rank latent and the rope key per layer, not full keys and values."""
    plan = plan_of(["actor_rollout_ref.model.path=examples/model_configs/deepseek-v2-lite", "trainer.device=cuda",
                    "actor_rollout_ref.rollout.name=vllm", "data.max_prompt_length=512",
                    "data.max_response_length=1024"], 80)
    # 27 layers x (512 + 64) values x 2 bytes (bf16) x 1536 positions
    assert plan.kv_floor == 27 * 576 * 2 * 1536 == 47_775_744
    # Qwen3-1.7B: keys and values, 2 x 28 layers x 8 kv heads x 128 x 2 bytes = 114,688 a token x 1536
    assert plan_of(QWEN3_1_7B_VERL, 80).kv_floor == 176_160_768


def test_an_engine_over_several_ranks_holds_its_share_of_the_weights_and_heads():
    tp2 = plan_of(QWEN3_1_7B_VERL + ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"], 80)
    # each rank holds half of every layer: 3,441,149,952 / 2 bf16 bytes; the reservation stays 0.6 x 80 GB a device
    assert tp2.terms["engine_weights"].bytes == 1_720_574_976
    assert tp2.terms["engine_weights"].bytes + tp2.terms["kv_cache"].bytes == pytest.approx(48e9)
    # 4 of the 8 kv heads a rank: 2 x 28 x 4 x 128 x 2 bytes = 57,344 a token x 1536 positions
    assert tp2.kv_floor == 88_080_384
    # more ranks than kv heads: vLLM replicates, one head a rank (2 x 28 x 1 x 128 x 2 x 1536)
    tp16 = ["trainer.n_gpus_per_node=16" if o == "trainer.n_gpus_per_node=8" else o for o in QWEN3_1_7B_VERL]
    assert plan_of(tp16 + ["actor_rollout_ref.rollout.tensor_model_parallel_size=16",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"], 80).kv_floor == 22_020_096


def test_a_critic_holds_its_weights_gradients_moments_and_update(tiny_folder):
    plan = plan_memory(load_config(None, tiny_overrides(tiny_folder) + ["algorithm.adv_estimator=gae",
                                                                        "critic.ppo_mini_batch_size=4"]), TINY)
    b = {name: term.bytes for name, term in plan.terms.items()}
    # the value model: the tied backbone (1448) and a value head 8 + bias 1 -> 1457, fp32 over 2 ranks
    assert b["critic_weights"] == b["critic_gradients"] == 4 * 1457 / 2 == 2914
    assert b["critic_optimizer"] == 5828
    # critic micro-batch 8 rows, at most the 4 a rank has, x 16 tokens = 64 x 128 values x 2 layers x 4 bytes
    assert b["critic_activations"] == 64 * 128 * 2 * 4 == 65536
    # root: embedding 32 x 8, final norm 8, value head 9 = 273; with one layer (592) gathered in fp32:
    # (273 + 592) x 4 = 3460, their gradients and reduce-scatter copies 2 x (273 + 592) x 4 = 6920
    assert b["critic_gathered"] == 10380
    # its update: the actor's shards, reference and moments (2896 + 2896 + 5792) beside all of the above
    assert plan.phase_bytes("critic update") == 11584 + 2914 + 2914 + 5828 + 65536 + 10380 == 99156
    # the actor's update keeps the critic's weights and moments: 67312 + 2914 + 5828
    assert plan.phase_bytes("update") == 76054
    assert plan.peak_phase == "critic update"


def test_dapo_generates_gen_batch_size_prompts(tiny_folder):
    overrides = tiny_overrides(tiny_folder) + ["algorithm.filter_groups.enable=true", "data.gen_batch_size=12"]
    plan = plan_memory(load_config(None, overrides), TINY)
    # 12 prompts x 2 / 2 ranks = 12 rows, each 2 (K, V) x 2 layers x 4 dims x 16 positions x 2 bytes = 512
    assert plan.rows_per_rank == 12 and plan.terms["kv_cache"].bytes == 12 * 512


def test_dynamic_batch_size_counts_the_token_budget(tiny_folder):
    overrides = tiny_overrides(tiny_folder) + ["actor_rollout_ref.actor.use_dynamic_bsz=true",
                                               "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100"]
    config = load_config(None, overrides)
    plan = plan_memory(config, TINY)
    # up to 100 tokens (not 2 rows x 16): 128 values x 2 layers x 100 x 4 bytes
    assert plan.terms["activations"].bytes == 102_400
    # up to 100 response tokens, fp32 x vocab 32, plus two chunks in flight
    assert plan.terms["logits"].bytes == 4 * 32 * (100 + 2 * 100)
    with pytest.raises(ConfigError, match="lower actor_rollout_ref.actor.ppo_max_token_len_per_gpu"):
        check_plan(replace(plan, capacity=1000), config)


def test_without_reshard_after_forward_every_layer_stays_gathered(tiny_folder):
    overrides = tiny_overrides(tiny_folder) + ["actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false"]
    plan = plan_memory(load_config(None, overrides), TINY)
    # the whole model, 1448 x 4 bytes (fp32 on a CPU), and the gradients in flight as before (8960)
    assert plan.terms["gathered"].bytes == 1448 * 4 + 8960


def test_resume_reads_weights_and_optimizer_into_rank_0s_host_ram(tiny_folder):
    plan = plan_memory(load_config(None, tiny_overrides(tiny_folder) + ["trainer.device=cuda"]), TINY, 80)
    # rank 0 reads the fp32 weights and both fp32 moments: 12 x 1448 bytes, in host RAM on a GPU
    assert plan.terms["resume_read"].host and plan.host_bytes("resume") == 12 * 1448
    assert plan.phase_bytes("resume") == 2896 + 2896 + 5792  # the shards and the moments loaded into them
    on_cpu = plan_memory(load_config(None, tiny_overrides(tiny_folder)), TINY)
    assert on_cpu.phase_bytes("resume") == 11584 + 12 * 1448  # a CPU's host RAM is its device
    no_resume = plan_memory(load_config(None, tiny_overrides(tiny_folder) + ["trainer.resume_mode=disable"]), TINY)
    assert "resume" not in no_resume.phases


def test_on_gpu_follows_trainer_device(tiny_folder, monkeypatch):
    import torch

    from rlvr.trainer.memory_plan import on_gpu

    base = [f"actor_rollout_ref.model.path={tiny_folder}"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not on_gpu(load_config(None, base + ["trainer.device=cpu"]))
    assert on_gpu(load_config(None, base + ["trainer.device=auto"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert on_gpu(load_config(None, base + ["trainer.device=cuda"]))
    assert not on_gpu(load_config(None, base + ["trainer.device=auto"]))


@pytest.mark.parametrize("device, cluster, gpu", [
    ("auto", {"CPU": 16.0, "GPU": 8.0}, True),   # the cluster has GPUs the TaskRunner does not see
    ("auto", {"CPU": 16.0}, False),
    ("cpu", {"CPU": 16.0, "GPU": 8.0}, False),   # trainer.device decides
    ("cuda", {"CPU": 16.0}, True),
])
def test_on_ray_the_worker_pools_and_the_replicas_go_where_the_cluster_has_gpus(tiny_folder, tmp_path, monkeypatch,
                                                                                  device, cluster, gpu):
    """ray_worker_groups' pools and replica_device both ask ray_uses_gpu, in a process that sees no
    CUDA of its own (the TaskRunner): the same answer for the same run."""
    import ray
    import torch

    import rlvr.distributed.ray_workers
    from rlvr.config.validate import ray_uses_gpu
    from rlvr.trainer.main import ray_worker_groups
    from rlvr.workers.rollout import replica_device

    class Pools(Exception):
        pass

    def pools_asked_for(pools, roles, use_gpu):
        raise Pools(use_gpu)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: cluster)
    monkeypatch.setattr(rlvr.distributed.ray_workers, "ResourcePoolManager", pools_asked_for)  # no actor starts
    config = load_config(None, [f"actor_rollout_ref.model.path={tiny_folder}", f"trainer.device={device}"])
    with pytest.raises(Pools) as pools:
        ray_worker_groups(config, 1, None, None, tmp_path)
    assert ray_uses_gpu(config) == pools.value.args[0] == (replica_device(config).type == "cuda") == gpu
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # not on Ray: this machine decides, as on_gpu
    assert replica_device(config).type == ("cuda" if device == "cuda" else "cpu")


def test_a_gpu_plan_on_a_machine_without_one_asks_for_the_capacity(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["plan", *QWEN3_1_7B_VERL]) == 2
    assert "--device-memory-gb" in capsys.readouterr().err
    assert cli.main(["plan", "--device-memory-gb", "80", *QWEN3_1_7B_VERL]) == 0
    out = capsys.readouterr().out
    assert "0.6 x 80.00 GB = 48.00 GB" in out and "rank 0's host RAM 20.65 GB" in out  # 12 x 1.72B bytes


def test_a_mixture_of_experts_update_gathers_every_expert_and_runs_its_active_ones():
    plan = plan_of(["actor_rollout_ref.model.path=examples/model_configs/mixtral-8x7b", "trainer.device=cuda",
                    "trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.strategy=fsdp2",
                    "data.train_batch_size=8", "actor_rollout_ref.rollout.n=2",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=8", "data.max_prompt_length=1024",
                    "data.max_response_length=1024", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"], 80)
    # per token and layer: 8 x 4096 hidden values + 4 x (2 active experts x 14336) = 147,456; x 32 layers
    # x 2048 tokens x 2 bytes (bf16 on a GPU) = 19,327,352,832
    assert plan.terms["activations"].bytes == 147_456 * 32 * 2048 * 2 == 19_327_352_832
    # FSDP2 gathers a whole layer, all 8 experts: 1,451,270,144 parameters, with the root (untied embedding
    # and head 2 x 32000 x 4096 + norm 4096 = 262,148,096), in bf16: 3,426,836,480; their fp32 gradients and
    # reduce-scatter copies 2 x (262,148,096 + 1,451,270,144) x 4 = 13,707,345,920
    assert plan.terms["gathered"].bytes == 3_426_836_480 + 13_707_345_920


def test_colocate_async_holds_the_engines_own_model_and_the_versions_sent_through_the_update(tiny_folder):
    # colocate_async, k = 2 ahead, local strategy on one device, bf16 rollout: P = 1448 (test above)
    overrides = tiny_overrides(tiny_folder) + ["actor_rollout_ref.actor.strategy=local", "trainer.n_gpus_per_node=1",
                                               "trainer.v1.trainer_mode=colocate_async",
                                               "trainer.v1.colocate_async.num_warmup_batches=2"]
    plan = plan_memory(load_config(None, overrides), TINY)
    b = {name: term.bytes for name, term in plan.terms.items()}
    # the engine's own fp32 model 4 x 1448 = 5792 plus its bf16 copy 2 x 1448 = 2896, kept
    assert b["engine_weights"] == 5792 + 2896 == 8688
    assert b["pending_weights"] == 2 * 5792 == 11584  # two fp32 versions queued behind the engine at most
    sync = plan_memory(load_config(None, overrides[:-2]), TINY)
    s = {name: term.bytes for name, term in sync.terms.items()}
    assert "pending_weights" not in s and s["engine_weights"] == 2896
    # the update now also holds the engine's own model (+ 8688 - 2896), its KV cache (8 rows x 16 positions:
    # 2 x 2 layers x 4 x 8 x 16 x 2 bytes = 4096), its packed projections (2816) and the pending versions (11584)
    assert b["kv_cache"] == 4096 and b["packed_weights"] == 2816
    assert plan.phase_bytes("update") - sync.phase_bytes("update") == (8688 - 2896) + 4096 + 2816 + 11584
    # sharded (fsdp2): the engine's model is its own, never gathered from the shards and freed
    sharded = plan_memory(load_config(None, overrides + ["actor_rollout_ref.actor.strategy=fsdp2"]), TINY)
    assert "engine_weights" in sharded.phases["update"] and "engine_weights" in sharded.phases["init"]
    # k = 0: colocate_async still builds the engine of its own (it was planned as the hybrid engine), and
    # the version sent waits for it, one fp32 copy
    zero = plan_memory(load_config(None, overrides[:-1] + ["trainer.v1.colocate_async.num_warmup_batches=0"]), TINY)
    z = {name: term.bytes for name, term in zero.terms.items()}
    assert z["engine_weights"] == 8688 and z["pending_weights"] == 5792



def test_servers_driven_ahead_hold_a_staging_copy_in_host_memory_only(tiny_folder):
    # colocate_async k = 2 on rollout servers: no engine on the actor's device; the trainer's process holds
    # the servers' driver, its fp32 model (4 x 1448 = 5792) and 2 versions sent (2 x 5792): 3 x 5792 = 17376
    overrides = tiny_overrides(tiny_folder) + ["actor_rollout_ref.actor.strategy=local", "trainer.n_gpus_per_node=1",
                                               "actor_rollout_ref.rollout.mode=async",
                                               "trainer.v1.trainer_mode=colocate_async",
                                               "trainer.v1.colocate_async.num_warmup_batches=2"]
    plan = plan_memory(load_config(None, overrides), TINY)
    b = {name: term.bytes for name, term in plan.terms.items()}
    assert b["server_staging"] == 3 * 5792 == 17376
    assert not {"engine_weights", "pending_weights", "kv_cache"} & set(b)
    assert all("server_staging" in names for names in plan.phases.values())
    # the hybrid engine on one server-driving worker has none; on a GPU it is host memory: 0 on the device
    assert "server_staging" not in plan_memory(load_config(None, overrides[:-2]), TINY).terms
    gpu = plan_memory(load_config(None, overrides + ["trainer.device=cuda"]), TINY, device_memory_gb=80)
    assert gpu.terms["server_staging"].bytes == 0

# ---------------------------------------------------------------- parameter counts, family by family
# Tiny configs as config.json would hold them; Gemma-2's has no tie_word_embeddings key (as gemma-2-2b-it's),
# where the family's default is tied.
_BASE = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
         "intermediate_size": 32, "vocab_size": 64}
FAMILY_CONFIGS = {
    "llama": {**_BASE, "model_type": "llama"},
    "qwen2": {**_BASE, "model_type": "qwen2", "tie_word_embeddings": False},
    "gemma2": {**_BASE, "model_type": "gemma2", "head_dim": 8},
    "gemma3_text": {**_BASE, "model_type": "gemma3_text", "head_dim": 8},
    "gemma4_text": {**_BASE, "model_type": "gemma4_text", "num_hidden_layers": 4, "head_dim": 8, "global_head_dim": 16,
                    "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 64, "sliding_window": 8,
                    "layer_types": ["sliding_attention", "full_attention"] * 2},
    "mixtral": {**_BASE, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {**_BASE, "model_type": "qwen3_moe", "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 8},
    "deepseek_v3": {**_BASE, "model_type": "deepseek_v3", "num_key_value_heads": 2, "moe_intermediate_size": 8,
                    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
                    "q_lora_rank": 8, "kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 4,
                    "v_head_dim": 4, "n_group": 2, "topk_group": 1},
    "glm4_moe": {**_BASE, "model_type": "glm4_moe", "head_dim": 8, "moe_intermediate_size": 8, "n_routed_experts": 4,
                 "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1,
                 "topk_group": 1},
}


def meta_numel(cfg: dict) -> int:
    """sum(p.numel()) of the model transformers builds from ``cfg`` (on the meta device: no memory)."""
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    config = CONFIG_MAPPING[cfg["model_type"]](**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_plan_counts_the_models_parameters(family, tmp_path):
    cfg = FAMILY_CONFIGS[family]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    plan = plan_memory(load_config(None, tiny_overrides(tmp_path)), read_model_config(str(tmp_path)))
    assert plan.params == meta_numel(cfg)


@pytest.mark.parametrize("family, active", [
    # layer: attention q 16x16 + k,v 16x8 each + o 16x16 = 768, 2 norms 32, router 16x4 = 64;
    # one expert 3 x 16 x 32 = 1536, 2 of 4 active -> 3072; embedding + head 2 x 64 x 16 = 2048, norm 16
    # 2 x (768 + 32 + 64 + 3072) + 2048 + 16 = 9936
    ("mixtral", 9936),
    # Qwen3-MoE: q 16x16 + k,v 16x8 each + o 16x16 = 768, q/k norms 8 + 8, 2 norms 32, router 64;
    # expert 3 x 16 x 8 = 384, 2 active -> 768; 2 x (768 + 16 + 32 + 64 + 768) + untied 2048 + 16 = 5360
    ("qwen3_moe", 5360),
    # DeepSeek-V3, latent attention: q_a 16x8 + norm 8 + q_b 8x(2 x 8) = 264; kv_a 16x(8+4) + norm 8 +
    # kv_b 8x(2 x (4+4)) = 328; o (2 x 4)x16 = 128 -> 720 a layer. Layer 0 dense MLP 3 x 16 x 32 = 1536;
    # layer 1: router 4 x 16 = 64, shared expert 3 x 16 x 8 = 384, 2 routed of 4 active 2 x 384 = 768.
    # 2 x 2 norms 64; untied 2048 + norm 16:
    # 720 + 1536 + 720 + 64 + 384 + 768 + 64 + 2048 + 16 = 6320
    ("deepseek_v3", 6320),
    # GLM-4-MoE (DeepSeek's layout, plain attention): attention 16x16 + 2 x 16x8 + 16x16 = 768 a layer, x 2;
    # layer 0 dense 3 x 16 x 32 = 1536; layer 1 router 64, shared expert 3 x 16 x 8 = 384, 2 routed of 4
    # active 768; 4 norms 64; untied 2048 + norm 16: 1536 + 1536 + 64 + 384 + 768 + 64 + 2064 = 6416
    ("glm4_moe", 6416),
])
def test_plan_shows_moe_active_parameters(family, active, tmp_path):
    cfg = FAMILY_CONFIGS[family]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    plan = plan_memory(load_config(None, tiny_overrides(tmp_path)), read_model_config(str(tmp_path)))
    assert plan.active_params == active
    assert f"{active / 1e9:.3f}B active" in format_plan(plan)


def test_dense_plan_active_equals_total(tiny_folder):
    plan = plan_memory(load_config(None, tiny_overrides(tiny_folder)), read_model_config(str(tiny_folder)))
    assert plan.active_params == plan.params == 1448


def test_gemma2_2b_without_tie_key_is_tied(tmp_path):
    # gemma-2-2b-it's config.json: no tie_word_embeddings key; Gemma-2's default is a tied head
    cfg = {"model_type": "gemma2", "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "vocab_size": 256000}
    # layer: q 2304 x 2048 + k, v 2304 x 1024 each + o 2048 x 2304 = 14,155,776; MLP 3 x 2304 x 9216 =
    # 63,700,992; 4 norms 9,216 -> 77,865,984; x 26 = 2,024,515,584; + embedding 256000 x 2304 = 589,824,000
    # + final norm 2,304 = 2,614,341,888 (an untied head would add 589,824,000: the 3.204B seen)
    assert ModelShape.from_config(cfg).params() == 2_614_341_888
    assert ModelShape.from_config(cfg).tied


# ---------------------------------------------------------------- async and pools: what overlaps what
ASYNC_LOCAL = ["actor_rollout_ref.actor.strategy=local", "trainer.n_gpus_per_node=1",
               "trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=1"]


def test_colocate_async_with_vllm_holds_the_rollout_workers_model_and_vllm_through_the_update(tiny_folder):
    """The RolloutWorker loads the policy in fp32 (vLLM streams its weights from that copy) beside
    vLLM's own weights; vLLM generates while the actor updates, so it cannot sleep through it."""
    overrides = tiny_overrides(tiny_folder) + ASYNC_LOCAL + ["actor_rollout_ref.rollout.name=vllm",
                                                             "trainer.device=cuda"]
    plan = plan_memory(load_config(None, overrides), TINY, device_memory_gb=1)
    b = {name: term.bytes for name, term in plan.terms.items()}
    # the rollout worker's fp32 model 4 x 1448 = 5792, kept; vLLM's bf16 weights 2 x 1448 = 2896
    assert b["rollout_model"] == 5792 and b["engine_weights"] == 2896
    for phase in ("update", "generation"):
        assert {"rollout_model", "engine_weights", "kv_cache", "pending_weights"} <= set(plan.phases[phase]), phase


def test_async_never_offloads(tiny_folder, monkeypatch):
    """param/optimizer offload happens in the hybrid worker's rollout_mode, which async never runs
    (its engine is a worker of its own): generation keeps the actor's state on the device."""
    overrides = tiny_overrides(tiny_folder) + ["actor_rollout_ref.actor.fsdp_config.param_offload=true",
                                               "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                                               "actor_rollout_ref.ref.fsdp_config.param_offload=true",
                                               "trainer.v1.trainer_mode=colocate_async",
                                               "trainer.v1.colocate_async.num_warmup_batches=1",
                                               "trainer.device=cuda", "trainer.n_gpus_per_node=1"]
    plan = plan_memory(load_config(None, overrides), TINY, device_memory_gb=1)
    assert {"weights", "reference", "optimizer"} <= set(plan.phases["generation"])


def test_the_critics_update_holds_the_generation_overlapping_it(tiny_folder):
    overrides = tiny_overrides(tiny_folder) + ASYNC_LOCAL + ["algorithm.adv_estimator=gae",
                                                             "critic.ppo_mini_batch_size=4"]
    plan = plan_memory(load_config(None, overrides), TINY)
    assert {"engine_weights", "kv_cache", "packed_weights", "pending_weights"} <= set(plan.phases["critic update"])
    sync = plan_memory(load_config(None, overrides[:-len(ASYNC_LOCAL)] + ASYNC_LOCAL[:2]
                                   + ["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=4"]), TINY)
    b = {name: term.bytes for name, term in plan.terms.items()}
    # the engine's own model (8688 against sync's kept bf16 copy 2896), its KV cache (4096), packed projections
    # (2816) and one pending fp32 version (5792)
    assert plan.phase_bytes("critic update") - sync.phase_bytes("critic update") == \
        (b["engine_weights"] - 2896) + b["kv_cache"] + b["packed_weights"] + b["pending_weights"] \
        == 5792 + 4096 + 2816 + 5792


def test_a_rollout_pool_is_planned_on_its_own_devices(tiny_folder):
    """hybrid_engine=false: the rollout workers hold the fp32 policy, the engine's copy, its KV cache
    and the version being received, on devices of their own; the actor's devices hold no engine."""
    overrides = tiny_overrides(tiny_folder) + ["actor_rollout_ref.hybrid_engine=false",
                                               "actor_rollout_ref.rollout.n_gpus_per_node=2"]
    plan = plan_memory(load_config(None, overrides), TINY)
    b = {name: term.bytes for name, term in plan.terms.items()}
    pool = set(plan.phases["rollout pool"])
    assert {"engine_weights", "kv_cache", "pending_weights"} <= pool
    # the pool's model: fp32 4 x 1448 = 5792 + its bf16 copy 2896; one fp32 version received, 5792; rows per
    # pool device 4 x 2 / 2 = 4, KV 2 x 2 layers x 1 head x 4 x 4 rows x 16 positions x 2 bytes = 2048
    assert b["engine_weights"] == 8688 and b["pending_weights"] == 5792 and b["kv_cache"] == 2048
    assert plan.phase_bytes("rollout pool") == 8688 + 5792 + 2048 + b["packed_weights"]
    for phase in ("init", "generation", "update"):
        assert not pool & set(plan.phases[phase]), phase


def test_gemma4_kv_cache_counts_each_layers_head_dim(tmp_path):
    cfg = FAMILY_CONFIGS["gemma4_text"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    plan = plan_memory(load_config(None, tiny_overrides(tmp_path)), read_model_config(str(tmp_path)))
    # sliding layers 0, 2: 1 kv head x head_dim 8; full layers 1, 3: 1 kv head x global_head_dim 16;
    # keys and values: 2 x (2 x 8 + 2 x 16) = 96 values a token, bf16, 4 rows x 16 positions -> 12288
    # (head_dim 8 for every layer would give 8192)
    assert plan.terms["kv_cache"].bytes == 96 * 2 * 4 * 16 == 12288


def test_the_engines_own_copies_name_their_own_settings(tiny_folder):
    from rlvr.trainer.memory_plan import term_fix

    config = load_config(None, tiny_overrides(tiny_folder) + ASYNC_LOCAL)
    assert "num_warmup_batches" in term_fix("pending_weights", config)
    assert "trainer.v1.trainer_mode=sync" in term_fix("rollout_model", config)
