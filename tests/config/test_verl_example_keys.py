"""verl's example scripts' keys, read with verl's meaning or refused with the one true reason.

Each case is a key (or a combination) that some of verl's example scripts set (volcengine/verl
b178a3cd, examples/ and recipe/): the Megatron-LM backend's keys, a cluster named by RAY_ADDRESS,
vision-language models, verl's global micro-batch sizes, offload on one device, resume_from_path,
verl's precision spellings, bypass mode's logged IS weights, the prime reward manager.
"""

import json

import pytest

from rlvr.config import ConfigError, load_config

VERL = {"base": "verl"}
# a verl script on one device (verl's defaults are 8 devices per node)
ONE_DEVICE = ["trainer.n_gpus_per_node=1", "trainer.nnodes=1"]


def load(*overrides, **kw):
    return load_config(None, list(overrides), **{**VERL, **kw})


# --- 1. the Megatron-LM backend ---------------------------------------------------------------------

def test_megatron_keys_are_refused_naming_the_backend_not_a_nearby_key():
    with pytest.raises(ConfigError) as err:
        load("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
             "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
             "actor_rollout_ref.ref.megatron.param_offload=True", "critic.megatron.use_dist_checkpointing=True",
             "actor_rollout_ref.actor.optim.lr_decay_style=constant", "+actor_rollout_ref.actor.load_weight=True")
    message = str(err.value)
    assert "verl's Megatron-LM backend" in message and "not implemented" in message
    assert "actor_rollout_ref.actor.strategy=fsdp2" in message and "did you mean" not in message
    for key in ("actor_rollout_ref.actor.megatron.*", "actor_rollout_ref.ref.megatron.*", "critic.megatron.*",
                "actor_rollout_ref.actor.optim.lr_decay_style", "actor_rollout_ref.actor.load_weight"):
        assert key in message, key
    assert message.count("Megatron-LM") == 1  # one message for them all


def test_megatrons_lora_keys_are_refused_with_rlvrs_lora_keys_never_dropped():
    # dropping them would turn the run into full fine-tuning
    with pytest.raises(ConfigError) as err:
        load("actor_rollout_ref.model.lora.rank=32", "actor_rollout_ref.model.lora.alpha=64",
             "actor_rollout_ref.model.lora.lora_A_init_method=kaiming")
    message = str(err.value)
    assert "Megatron" in message
    assert "actor_rollout_ref.model.lora_rank=32" in message and "actor_rollout_ref.model.lora_alpha=64" in message


def test_megatron_strategy_and_megatron_model_sections_name_the_backend():
    with pytest.raises(ConfigError, match="Megatron-LM backend"):
        load("actor_rollout_ref.actor.strategy=megatron")
    with pytest.raises(ConfigError, match="Megatron-LM backend"):
        load("critic.strategy=megatron")
    # Megatron's model_config sits under the HF override_config dict, where it would set nothing
    with pytest.raises(ConfigError, match="override_config.model_config.* .*Megatron-LM backend"):
        load("+actor_rollout_ref.model.override_config.model_config.max_position_embeddings=10240")


@pytest.mark.parametrize("entry", ["ppo_megatron_trainer", {"actor@actor_rollout_ref.actor": "megatron_actor"},
                                   {"critic@critic": "megatron_critic"}])
def test_a_defaults_list_naming_megatron_is_refused_naming_the_backend(tmp_path, entry):
    f = tmp_path / "mine.yaml"
    f.write_text(json.dumps({"defaults": [entry, "_self_"], "data": {"train_batch_size": 8}}))
    with pytest.raises(ConfigError) as err:
        load_config(f, [])
    assert "verl's Megatron-LM backend" in str(err.value) and "composes no Hydra config groups" not in str(err.value)


# --- 2. several nodes on the cluster of RAY_ADDRESS ---------------------------------------------------

NODES = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.strategy=fsdp2", "trainer.device=cpu",
         "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]


def test_several_nodes_run_on_the_cluster_ray_address_names(monkeypatch, capsys):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # what `ray job submit` sets; never connected to here
    cfg = load(*NODES)
    assert cfg.ray_kwargs.ray_init.address == "127.0.0.1:6379"
    assert "RAY_ADDRESS" in capsys.readouterr().err
    # an address in the config wins, as in ray.init
    assert load(*NODES, "ray_kwargs.ray_init.address=auto").ray_kwargs.ray_init.address == "auto"


def test_several_nodes_without_an_address_or_ray_address_are_refused_naming_both(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match=r"nnodes = 2: .*RAY_ADDRESS.*ray_kwargs.ray_init.address"):
        load(*NODES)


def test_one_device_with_ray_address_trains_in_process_and_says_so(monkeypatch, capsys):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    cfg = load(*ONE_DEVICE)
    assert cfg.ray_kwargs.ray_init.address is None
    assert "RAY_ADDRESS" in capsys.readouterr().err


# --- 3. vision-language models -------------------------------------------------------------------------

TEXT_ONLY = "rlvr trains text models"


@pytest.mark.parametrize("override", [
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.limit_mm_per_prompt={image: 2}",
    "data.image_key=images", "data.video_key=videos", "actor_rollout_ref.actor.freeze_vision_tower=True",
])
def test_multimodal_keys_are_refused_because_rlvr_trains_text_models(override):
    with pytest.raises(ConfigError) as err:
        load(override)
    message = str(err.value)
    assert TEXT_ONLY in message and "image" in message
    assert "set those" not in message  # no rlvr rollout key covers them


def test_verls_own_default_image_key_is_not_refused():
    cfg = load()  # verl's defaults (data.image_key: images is verl's default, not a script's setting)
    assert cfg.data.train_batch_size == 1024


def test_a_vision_chat_template_is_refused_as_multimodal():
    template = "{% for m in messages %}{% if m['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    with pytest.raises(ConfigError, match=TEXT_ONLY):
        load(f"actor_rollout_ref.model.custom_chat_template={json.dumps(template)}")


def test_a_vision_language_model_folder_is_refused_at_load(tmp_path):
    folder = tmp_path / "qwen2.5-vl"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "architectures":
                                                    ["Qwen2_5_VLForConditionalGeneration"],
                                                    "vision_config": {"depth": 32}, "hidden_size": 3584}))
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.model.path .*vision_config.*rlvr trains text models"):
        load(f"actor_rollout_ref.model.path={folder}", *ONE_DEVICE)


# --- 4. verl's global micro-batch sizes ------------------------------------------------------------

EIGHT = ["trainer.n_gpus_per_node=8", "trainer.device=cpu"]


def test_global_micro_batch_sizes_are_divided_by_the_devices(capsys):
    cfg = load(*EIGHT, "actor_rollout_ref.actor.ppo_micro_batch_size=64",
               "actor_rollout_ref.rollout.log_prob_micro_batch_size=128",
               "actor_rollout_ref.ref.log_prob_micro_batch_size=32", "algorithm.adv_estimator=gae",
               "critic.ppo_micro_batch_size=16")
    arr = cfg.actor_rollout_ref
    # verl: value // (world size / Ulysses size) = value // 8
    assert arr.actor.ppo_micro_batch_size_per_gpu == 8  # 64 // 8
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 16  # 128 // 8
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 4  # 32 // 8
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 2  # 16 // 8
    err = capsys.readouterr().err
    assert "actor_rollout_ref.actor.ppo_micro_batch_size=64" in err and "64 // 8" in err


def test_the_divisor_is_the_final_device_count_whatever_layer_sets_it(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("actor_rollout_ref:\n  actor:\n    ppo_micro_batch_size: 32\n")
    cfg = load_config(f, [*EIGHT], base="verl")
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4  # 32 // 8, n_gpus set after the file


def test_global_and_per_device_micro_batch_together_are_refused():
    with pytest.raises(ConfigError, match=r"ppo_micro_batch_size=64 .* and actor_rollout_ref.actor."
                                          r"ppo_micro_batch_size_per_gpu=4 .* keep one"):
        load(*EIGHT, "actor_rollout_ref.actor.ppo_micro_batch_size=64",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")


def test_a_global_micro_batch_smaller_than_the_devices_is_refused():
    with pytest.raises(ConfigError, match=r"log_prob_micro_batch_size=4 .* 4 // 8 = 0"):
        load(*EIGHT, "actor_rollout_ref.rollout.log_prob_micro_batch_size=4")


# --- 5. offload on one device ---------------------------------------------------------------------

# verl's examples/tuning/7b/qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh, on its one GPU
TUNING = ["trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.device=cuda",
          "actor_rollout_ref.actor.fsdp_config.param_offload=True",
          "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
          "actor_rollout_ref.ref.fsdp_config.param_offload=True"]
LORA = ["actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora_alpha=32",
        "actor_rollout_ref.model.target_modules=all-linear"]


def test_offload_on_one_gpu_shards_with_fsdp2_as_verls_fsdp_does(capsys):
    cfg = load(*TUNING)
    actor = cfg.actor_rollout_ref.actor
    assert actor.strategy == "fsdp2"  # verl's default strategy (fsdp) offloads on one GPU too
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert "fsdp2" in capsys.readouterr().err


def test_offload_with_lora_on_one_gpu_loads_unsharded_and_says_the_state_stays(capsys):
    cfg = load(*TUNING, *LORA)
    arr = cfg.actor_rollout_ref
    assert arr.actor.strategy == "local" and arr.model.lora_rank == 32
    assert not (arr.actor.fsdp_config.param_offload or arr.actor.fsdp_config.optimizer_offload
                or arr.ref.fsdp_config.param_offload)
    err = capsys.readouterr().err
    assert "param_offload" in err and "on the device" in err


@pytest.mark.parametrize("lora", [[], LORA], ids=["full", "lora"])
def test_offload_under_device_auto_without_cuda_loads_with_a_notice(lora, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # trainer.device=auto runs on the CPU
    cfg = load(*[o for o in TUNING if o != "trainer.device=cuda"], *lora)
    assert cfg.actor_rollout_ref.actor.strategy == "local"
    assert "param_offload" in capsys.readouterr().err


def test_offload_with_an_explicit_local_strategy_is_refused_without_advice_that_is_refused():
    with pytest.raises(ConfigError) as err:
        load(*TUNING, *LORA, "actor_rollout_ref.actor.strategy=local")
    assert "strategy=fsdp2" not in str(err.value)  # LoRA under fsdp2 is refused too
    with pytest.raises(ConfigError, match="strategy=fsdp2"):
        load(*TUNING, "actor_rollout_ref.actor.strategy=local")
    with pytest.raises(ConfigError) as err:  # LoRA under fsdp2: local, with the offloads off
        load(*TUNING, *LORA, "actor_rollout_ref.actor.strategy=fsdp2")
    assert "strategy=local" in str(err.value) and "offload" in str(err.value)


# --- 6. trainer.resume_from_path ------------------------------------------------------------------

def _checkpoint(tmp_path):
    folder = tmp_path / "global_step_2"
    folder.mkdir()
    (folder / "trainer_state.pt").write_bytes(b"")
    return folder


def test_resume_from_path_with_resume_path_names_the_checkpoint(tmp_path, capsys):
    folder = _checkpoint(tmp_path)
    cfg = load("trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder}", *ONE_DEVICE)
    assert cfg.trainer.resume_mode == str(folder)
    assert "resume_from_path" in capsys.readouterr().err


def test_resume_path_without_resume_from_path_is_refused():
    with pytest.raises(ConfigError, match="resume_mode=resume_path .*trainer.resume_from_path"):
        load("trainer.resume_mode=resume_path", *ONE_DEVICE)


def test_resume_from_path_is_ignored_otherwise_as_verl_does(tmp_path, capsys):
    cfg = load(f"trainer.resume_from_path={tmp_path}", *ONE_DEVICE)
    assert cfg.trainer.resume_mode == "auto"
    err = capsys.readouterr().err
    assert "trainer.resume_from_path" in err and "no effect" in err
    cfg = load("trainer.resume_from_path=null", *ONE_DEVICE)
    assert cfg.trainer.resume_mode == "auto" and "resume_from_path" not in capsys.readouterr().err


# --- 7. verl's precision spellings ----------------------------------------------------------------

MP = "actor_rollout_ref.actor.fsdp_config.mixed_precision"


def test_verls_precision_spellings_are_read_as_rlvrs_names():
    cfg = load(*EIGHT, f"+{MP}.param_dtype=bf16", f"+{MP}.reduce_dtype=fp32")
    mp = cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision
    assert (mp.param_dtype, mp.reduce_dtype) == ("bfloat16", "float32")
    cfg = load(*EIGHT, f"{MP}.param_dtype=fp32", f"{MP}.reduce_dtype=bf16")
    mp = cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision
    assert (mp.param_dtype, mp.reduce_dtype) == ("float32", "bfloat16")


def test_buffer_dtype_fp32_is_rlvrs_behaviour_and_another_is_refused(capsys):
    load(*EIGHT, f"+{MP}.buffer_dtype=fp32")
    assert f"{MP}.buffer_dtype" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=rf"{MP}.buffer_dtype='bf16' .*float32"):
        load(*EIGHT, f"+{MP}.buffer_dtype=bf16")


# --- 8. bypass mode's importance weights under ppo_clip ---------------------------------------------

RC = "algorithm.rollout_correction"


def test_bypass_ppo_clip_weights_are_verls_metrics_only_and_never_applied(capsys):
    cfg = load(f"{RC}.bypass_mode=true", f"{RC}.rollout_is=token", f"{RC}.loss_type=ppo_clip", *ONE_DEVICE)
    # verl's bypass loss computes them for its metrics only, and so does rlvr's actor: the key stays read
    # (tests/algos/test_microbatch_invariance.py: the weights reach the metrics, not the loss)
    assert cfg.algorithm.rollout_correction.rollout_is == "token"
    err = capsys.readouterr().err
    assert f"{RC}.rollout_is=token" in err and "not applied" in err
    # loss_type=reinforce applies them, as verl's
    cfg = load(f"{RC}.bypass_mode=true", f"{RC}.rollout_is=token", f"{RC}.loss_type=reinforce", *ONE_DEVICE)
    assert cfg.algorithm.rollout_correction.rollout_is == "token"


# --- 9. the prime reward manager, a key verl dropped ----------------------------------------------

def test_the_prime_reward_manager_is_the_scorer_in_a_pool_of_64(capsys):
    cfg = load("reward_model.reward_manager=prime", *ONE_DEVICE)
    assert cfg.reward.num_workers == 64  # verl's PrimeRewardManager scores in 64 processes
    assert "prime" in capsys.readouterr().err
    cfg = load("reward_model.reward_manager=prime", "reward.num_workers=4", *ONE_DEVICE)
    assert cfg.reward.num_workers == 4


def test_a_key_verl_itself_dropped_gets_no_guess(capsys):
    cfg = load("+actor_rollout_ref.rollout.sglang_rollout_mode=server", *ONE_DEVICE)
    err = capsys.readouterr().err
    assert "sglang_rollout_mode" in err and "did you mean" not in err
    assert cfg.actor_rollout_ref.rollout.name == "native"


def test_a_later_layer_choosing_another_reward_manager_undoes_prime(tmp_path, capsys):
    # the file chooses prime, the command line naive: the command line wins, so no pool of 64 and no notice
    config = tmp_path / "run.yaml"
    config.write_text("reward_model:\n  reward_manager: prime\n")
    cfg = load_config(config, ["reward_model.reward_manager=naive", *ONE_DEVICE], **VERL)
    assert cfg.reward.num_workers != 64
    assert "prime" not in capsys.readouterr().err


def test_verls_newer_reward_manager_spelling_takes_prime_too(capsys):
    cfg = load("+reward_manager.name=prime", *ONE_DEVICE)
    assert cfg.reward.num_workers == 64
    assert "prime" in capsys.readouterr().err
