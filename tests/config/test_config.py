import pytest
import torch

from rlvr.config import ConfigError, RLVRConfig, known_keys, load_config, parse_overrides, to_yaml


def test_default_recipe_is_grpo_and_valid():
    cfg = load_config()
    assert isinstance(cfg, RLVRConfig)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.actor.use_kl_loss is True
    assert cfg.actor_rollout_ref.rollout.n >= 4
    # interpolation resolved at load
    assert cfg.trainer.default_local_dir == "runs/rlvr/arithmetic_grpo"


def test_overrides_are_typed():
    cfg = load_config(overrides=["data.train_batch_size=16", "actor_rollout_ref.actor.optim.lr=3e-6",
                                 "actor_rollout_ref.actor.use_kl_loss=false", "trainer.logger=[console,tensorboard]",
                                 "actor_rollout_ref.actor.clip_ratio_high=0.28"])
    assert cfg.data.train_batch_size == 16
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-6)
    assert cfg.actor_rollout_ref.actor.use_kl_loss is False
    assert cfg.trainer.logger == ["console", "tensorboard"]
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == pytest.approx(0.28)


def test_single_file_for_list_key_is_wrapped():
    cfg = load_config(overrides=["data.train_files=/x/train.parquet"])
    assert cfg.data.train_files == ["/x/train.parquet"]


def test_config_file_layer(tmp_path):
    f = tmp_path / "my.yaml"
    f.write_text("algorithm:\n  adv_estimator: rloo\ndata:\n  train_batch_size: 4\nactor_rollout_ref:\n"
                 "  actor:\n    ppo_mini_batch_size: 2\n")
    cfg = load_config(f, ["actor_rollout_ref.rollout.n=8"])
    assert (cfg.algorithm.adv_estimator, cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == ("rloo", 4, 8)
    # a partial file layers over the GRPO recipe: keys it does not set keep the recipe's values
    assert cfg.actor_rollout_ref.actor.use_kl_loss is True and cfg.actor_rollout_ref.actor.optim.lr == 1e-5


def test_unknown_key_suggests_nearest():
    with pytest.raises(ConfigError, match=r"unknown config key 'data.train_batch_sise' \(from the command line\); "
                                          r"did you mean 'data.train_batch_size'"):
        load_config(overrides=["data.train_batch_sise=3"])


def test_key_in_wrong_section_suggests_the_right_one(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("actor_rollout_ref:\n  rollout:\n    kl_loss_coef: 0.1\n")
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.rollout.kl_loss_coef' \(from file .*bad.yaml'\); "
                                          r"did you mean 'actor_rollout_ref.actor.kl_loss_coef'"):
        load_config(f)


def test_wrong_type_names_key_and_source():
    with pytest.raises(ConfigError, match=r"'data.train_batch_size' \(from the command line\).*'abc'"):
        load_config(overrides=["data.train_batch_size=abc"])


def test_section_given_a_value():
    with pytest.raises(ConfigError, match="'actor_rollout_ref.actor' .* is a section"):
        load_config(overrides=["actor_rollout_ref.actor=3"])


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not of the form key=value"):
        parse_overrides(["data.train_batch_size"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(tmp_path / "list.yaml")


def test_a_mini_batch_not_dividing_the_train_batch_leaves_a_smaller_last_one():
    # verl's run_qwen3-1.7b.sh: 1024 prompts in mini-batches of 80 -> 12 of 80 and a last one of 64
    cfg = load_config(overrides=["data.train_batch_size=1024", "actor_rollout_ref.actor.ppo_mini_batch_size=80",
                                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 80


def test_mini_batch_larger_than_train_batch():
    with pytest.raises(ConfigError, match="ppo_mini_batch_size = 16 prompts is larger than data.train_batch_size = 8"):
        load_config(overrides=["actor_rollout_ref.actor.ppo_mini_batch_size=16"])


def test_micro_batch_not_dividing_mini_batch():
    # mini-batch 8 prompts x 4 = 32 responses on 1 device; 32 % 5 != 0
    with pytest.raises(ConfigError, match="= 32 responses, is not divisible by ppo_micro_batch_size_per_gpu = 5"):
        load_config(overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5", "actor_rollout_ref.rollout.n=4"])


def test_micro_batch_larger_than_per_device_mini_batch_holds_all_of_it():
    # 32 responses over 2 devices = 16 per device < micro 32: one micro-batch of 16 (the recipe's micro-batch
    # of 16 must not refuse PPO's n = 1, 8 rows a mini-batch)
    cfg = load_config(overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32", "trainer.n_gpus_per_node=2",
                                 "actor_rollout_ref.rollout.n=4", "trainer.device=cpu"])
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 32


def test_prompt_groups_not_splitting_over_devices():
    # 8 prompts (whole groups of 4 responses) over 3 devices: 8 % 3 = 2
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["trainer.n_gpus_per_node=3", "actor_rollout_ref.rollout.n=4",
                               "actor_rollout_ref.actor.strategy=fsdp2"])
    assert "data.train_batch_size = 8 prompts cannot be split evenly over 3 devices" in str(err.value)
    assert "ppo_mini_batch_size = 8 prompts cannot be split evenly over 3 devices" in str(err.value)
    assert "gen_batch_size" not in str(err.value)  # unset: it is train_batch_size, reported once


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is the GPU there")
def test_offload_under_auto_on_a_machine_without_cuda_is_said_to_do_nothing(capsys):
    """A GPU script (verl's set param_offload) loads on a CPU machine, as it did, but its offload is
    no longer a silent no-op: a notice says so."""
    load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp2",
                           "actor_rollout_ref.actor.fsdp_config.param_offload=true"])
    assert "actor.fsdp_config.param_offload} have no effect here: this machine has no CUDA device" in \
        capsys.readouterr().err


def test_several_devices_need_fsdp2_and_offload_needs_a_gpu():
    with pytest.raises(ConfigError, match="2 devices: the actor is split over them with FSDP2; set .*strategy=fsdp2"):
        load_config(overrides=["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=local"])
    with pytest.raises(ConfigError, match="param_offload moves GPU memory to the CPU; with trainer.device=cpu"):
        load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp2", "trainer.device=cpu",
                               "actor_rollout_ref.actor.fsdp_config.param_offload=true"])
    with pytest.raises(ConfigError, match="optimizer_offload needs actor_rollout_ref.actor.strategy=fsdp2"):
        load_config(overrides=["actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                               "actor_rollout_ref.actor.strategy=local"])
    with pytest.raises(ConfigError, match="strategy=fsdp2 is not implemented yet; use strategy=local .* for LoRA"):
        load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.model.lora_rank=8"])
    with pytest.raises(ConfigError, match="critic.model.lora_rank > 0 with strategy=fsdp2 .* sharded like the actor"):
        load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp2", "algorithm.adv_estimator=gae",
                               "critic.model.lora_rank=8"])
    with pytest.raises(ConfigError, match="nnodes = 2: several nodes run on an existing Ray cluster"):
        load_config(overrides=["trainer.nnodes=2", "actor_rollout_ref.actor.strategy=fsdp2"])
    cfg = load_config(overrides=["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=fsdp2",
                                 "trainer.device=cpu"])
    assert cfg.trainer.n_gpus_per_node == 2


def test_group_estimator_needs_n_at_least_2_and_errors_are_collected():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["actor_rollout_ref.rollout.n=1", "data.truncation=sideways",
                               "actor_rollout_ref.actor.clip_ratio_c=0.5"])
    msg = str(err.value)
    assert "rollout.n = 1" in msg and "'sideways' is not one of" in msg and "clip_ratio_c = 0.5 must be > 1" in msg


def test_distillation_alone_trains_no_advantage_so_one_response_a_prompt_loads():
    # verl's OPD scripts sample n=1: with use_task_rewards=false the group advantage reaches no loss
    alone = ["actor_rollout_ref.rollout.n=1", "distillation.enabled=true",
             "distillation.teacher_models.teacher_model.model_path=builtin",
             "actor_rollout_ref.actor.use_kl_loss=false", "distillation.distillation_loss.use_task_rewards=false"]
    assert load_config(overrides=alone).actor_rollout_ref.rollout.n == 1
    with pytest.raises(ConfigError, match="compares responses within a group, but actor_rollout_ref.rollout.n = 1"):
        load_config(overrides=[*alone[:-1], "distillation.distillation_loss.use_task_rewards=true"])


def test_nonpositive_sizes():
    with pytest.raises(ConfigError, match="data.train_batch_size must be >= 1, got 0"):
        load_config(overrides=["data.train_batch_size=0"])
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.max_num_seqs must be >= 1, got 0"):
        load_config(overrides=["actor_rollout_ref.rollout.max_num_seqs=0"])
    assert load_config(overrides=["actor_rollout_ref.rollout.max_num_seqs=8"]).actor_rollout_ref.rollout.max_num_seqs == 8


def test_dynamic_bsz_token_budget():
    with pytest.raises(ConfigError, match=r"ppo_max_token_len_per_gpu = 100 is smaller .* = 192"):
        load_config(overrides=["actor_rollout_ref.actor.use_dynamic_bsz=true",
                               "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100"])


def test_yaml_roundtrip_and_known_keys(tmp_path):
    cfg = load_config(overrides=["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4"])
    f = tmp_path / "resolved.yaml"
    f.write_text(to_yaml(cfg))
    assert load_config(f) == cfg
    keys = known_keys()
    assert "actor_rollout_ref.actor.optim.lr" in keys and "algorithm.kl_ctrl.kl_coef" in keys


def test_training_temperature_zero_is_refused_with_the_fix():
    # the actor computes softmax(logits / T): T = 0 made every update NaN and silently skipped
    with pytest.raises(ConfigError, match=r"rollout.temperature = 0.0.*temperature > 0.*val_kwargs.do_sample=false"):
        load_config(overrides=["actor_rollout_ref.rollout.temperature=0"])


@pytest.mark.parametrize("key", ["actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_penalty"])
def test_full_kl_is_refused_with_an_explanation(key):
    # per-token log-probs cannot give the full-distribution KL (a shape error, or rows mixed)
    with pytest.raises(ConfigError, match=rf"{key} = 'full'.*one log-prob per sampled token; use low_var_kl"):
        load_config(overrides=[f"{key}=full"])


def test_reward_timeout_must_be_positive_or_null():
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError, match=r"reward.timeout_s = -?[01](\.0)? must be > 0 seconds; set it to null"):
            load_config(overrides=[f"reward.timeout_s={bad}"])
    assert load_config(overrides=["reward.timeout_s=null"]).reward.timeout_s is None


def test_a_rollout_of_its_own_checks_its_pool():
    cfg = load_config(overrides=["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=2"])
    assert not cfg.actor_rollout_ref.hybrid_engine and cfg.actor_rollout_ref.rollout.n_gpus_per_node == 2
    with pytest.raises(ConfigError, match="8 prompts cannot be split evenly over the 3 rollout workers"):
        load_config(overrides=["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.n_gpus_per_node=3"])
    with pytest.raises(ConfigError, match="n_gpus_per_node sizes the rollout's own pool, which exists only with"):
        load_config(overrides=["actor_rollout_ref.rollout.n_gpus_per_node=2"])
    with pytest.raises(ConfigError, match="hybrid_engine=false with LoRA is not implemented yet"):
        load_config(overrides=["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.model.lora_rank=8"])


def test_every_schema_key_is_read_outside_the_config_package_or_refused():
    """A key that nothing reads would be silently ignored: each leaf key's name must be read
    (``.name`` or ``"name"``) somewhere in rlvr/ outside rlvr/config/, or refused at load."""
    import dataclasses
    import pathlib
    import re

    from rlvr.config.validate import NOT_IMPLEMENTED

    root = pathlib.Path(__file__).parents[2] / "rlvr"
    source = "\n".join(p.read_text() for p in root.rglob("*.py") if "config" not in p.relative_to(root).parts)
    refused = {key for key, _, _ in NOT_IMPLEMENTED}
    unread = [key for key, tp in known_keys().items()
              if not dataclasses.is_dataclass(tp) and key not in refused
              and not re.search(rf"""(\.|["']){re.escape(key.rsplit('.', 1)[-1])}\b""", source)]
    assert unread == []


def test_hydra_style_overrides():
    cfg = load_config(overrides=["+actor_rollout_ref.actor.clip_ratio_high=0.28", "++data.train_batch_size=4",
                                 "actor_rollout_ref.actor.ppo_mini_batch_size=4", "~actor_rollout_ref.actor.optim.lr",
                                 "~trainer.test_freq=12"])
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == pytest.approx(0.28) and cfg.data.train_batch_size == 4
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6  # the recipe's 1e-5 deleted: back to the schema default
    assert cfg.trainer.test_freq == -1
    # the later of a deletion and a setting of one key wins, as between two settings (the deletion always did)
    assert load_config(overrides=["~trainer.test_freq", "trainer.test_freq=5"]).trainer.test_freq == 5
    assert load_config(overrides=["trainer.test_freq=5", "~trainer.test_freq"]).trainer.test_freq == -1
    with pytest.raises(ConfigError, match=r"unknown config key 'data.train_batch_sise' .*did you mean 'data.train_batch_size'"):
        load_config(overrides=["+data.train_batch_sise=3"])
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.tesst_freq' \(from the command line, ~"):
        load_config(overrides=["~trainer.tesst_freq"])


def test_verl_keys_without_effect_get_a_notice_and_renamed_ones_the_rlvr_name(tmp_path, capsys):
    f = tmp_path / "verl.yaml"
    f.write_text("actor_rollout_ref:\n  model:\n    use_remove_padding: true\n  actor:\n    fsdp_config:\n"
                 "      param_offload: false\n      wrap_policy: {min_num_params: 0}\n"
                 "  rollout:\n    name: vllm\n    gpu_memory_utilization: 0.6\n    calculate_log_probs: true\n"
                 "    tensor_model_parallel_size: 1\ntrainer:\n  critic_warmup: 0\n")
    cfg = load_config(f)
    err = capsys.readouterr().err
    assert "param_offload" not in err  # read: FSDP2 offload
    assert err.count("[rlvr] note: verl settings (from file") == 1  # one notice for the file
    for key in ("model.use_remove_padding", "actor.fsdp_config.wrap_policy", "rollout.calculate_log_probs"):
        assert f"actor_rollout_ref.{key}" in err, key
    assert "trainer.critic_warmup" in err
    for key in ("gpu_memory_utilization", "tensor_model_parallel_size"):  # read by the vllm engine
        assert key not in err, key
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.6
    assert "did you mean" not in err and cfg.algorithm.adv_estimator == "grpo"
    # verl's global micro-batch is read per device (4 rows over 1 device; tests/config/test_verl_example_keys.py)
    cfg = load_config(overrides=["actor_rollout_ref.actor.ppo_micro_batch_size=4"])
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4
    with pytest.raises(ConfigError, match=r"'data.tokenizer' \(from the command line\) is verl's name; rlvr's is "
                                          r"actor_rollout_ref.model.tokenizer_path"):
        load_config(overrides=["data.tokenizer=/models/tok"])
    # verl's custom_reward_function is read as reward.custom_reward_function (issue 48; refused before)
    scorer = tmp_path / "my.py"
    scorer.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    cfg = load_config(overrides=[f"custom_reward_function.path={scorer}", "custom_reward_function.name=score"])
    assert (cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name) == (str(scorer), "score")


def test_recipe_by_name():
    cfg = load_config("grpo")
    assert cfg.algorithm.adv_estimator == "grpo"


def test_custom_modules_register_names_before_validation(custom_algos_file):
    f = custom_algos_file
    with pytest.raises(ConfigError, match="'test_sign_adv' is not registered"):
        load_config(overrides=["algorithm.adv_estimator=test_sign_adv"])
    cfg = load_config(overrides=[f"custom_modules=[{f}]", "algorithm.adv_estimator=test_sign_adv",
                                 "actor_rollout_ref.actor.policy_loss.loss_mode=test_verl_signature"])
    assert cfg.algorithm.adv_estimator == "test_sign_adv"
    assert load_config(overrides=[f"custom_modules=[{f}]"]).custom_modules == [str(f)]  # importing twice is fine
    with pytest.raises(ConfigError, match=r"custom_modules: '/no/such.py' does not exist"):
        load_config(overrides=["custom_modules=[/no/such.py]"])


@pytest.mark.parametrize("overrides,message", [
    (["actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true"],
     r"multi_turn.enable=true needs actor_rollout_ref.rollout.multi_turn.tool_config_path"),
    (["actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.multi_turn.tool_config_path=calculator"],
     r"needs data.return_raw_chat=true"),
    (["actor_rollout_ref.rollout.multi_turn.tool_config_path=calculator"], r"the tools would never be called"),
    (["actor_rollout_ref.rollout.multi_turn.format=xml"], r"multi_turn.format = 'xml' is not one of \['hermes', 'tag'\]"),
    (["actor_rollout_ref.rollout.multi_turn.max_assistant_turns=0"], r"max_assistant_turns = 0 must be >= 1"),
    (["actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=top"], r"tool_response_truncate_side = 'top'"),
    (["actor_rollout_ref.rollout.multi_turn.schedule=batch"], r"multi_turn.schedule = .batch. is not one of \[.request., .turn.\]"),
    (["actor_rollout_ref.rollout.multi_turn.tool_timeout_s=0"], r"tool_timeout_s = 0.0 must be > 0"),
    (["actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2"],
     r"max_parallel_calls = 2 would have no effect: generation stops at the first call's closing tag.*set it to 1"),
    (["actor_rollout_ref.rollout.multi_turn.max_turns=3"], r"verl's name; rlvr's is actor_rollout_ref.rollout.multi_turn.max_assistant_turns"),
])
def test_multi_turn_settings_are_checked(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_calculator_recipe_loads():
    cfg = load_config("calculator", [])
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert mt.enable and mt.format == "tag" and mt.tool_config_path == "calculator" and cfg.data.return_raw_chat


def test_a_user_set_run_length_is_not_outranked_by_the_recipe(tmp_path, capsys):
    from rlvr.trainer.main import total_steps

    # grpo.yaml says total_training_steps: 24; a verl user's total_epochs=15 must decide instead
    cfg = load_config(overrides=["trainer.total_epochs=15"])
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (15, None)
    assert total_steps(cfg, batches_per_epoch=10) == 150  # 15 epochs x 10 batches, not 24
    assert "total_training_steps=24 (from the recipe" in capsys.readouterr().err
    user = tmp_path / "verl.yaml"
    user.write_text("trainer:\n  total_epochs: 3\n")
    cfg = load_config(user, ["actor_rollout_ref.rollout.n=8"])  # a verl config file does the same
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (3, None)
    # the user's own file's epochs and command line's steps are both kept (Hydra merges them in
    # verl): the first reached ends the run, 3 epochs x 1 batch = 3 before 5 steps
    cfg = load_config(user, ["trainer.total_training_steps=5"])
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (3, 5)
    assert total_steps(cfg, batches_per_epoch=1) == 3
    assert total_steps(cfg, batches_per_epoch=10) == 5
    cfg = load_config(overrides=["trainer.total_epochs=2", "trainer.total_training_steps=7"])
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (2, 7)
    assert total_steps(cfg, batches_per_epoch=10) == 7  # min(7, 2 x 10)
    assert total_steps(cfg, batches_per_epoch=3) == 6  # min(7, 2 x 3)
    assert load_config("dapo").trainer.total_training_steps == 24  # a recipe over the recipe keeps it


def test_the_run_ends_at_the_first_of_steps_and_epochs_as_in_verl():
    """verl's fit loop runs total_epochs passes and returns at total_training_steps: whichever
    comes first (ray_trainer.py fit)."""
    from rlvr.trainer.main import total_steps

    # verl's base: 500 steps, 10 epochs of 14 batches = 140 steps come first
    cfg = load_config("verl", ["trainer.total_training_steps=500", "trainer.total_epochs=10"])
    assert total_steps(cfg, batches_per_epoch=14) == 140
    # steps alone under verl's base keep verl's 30 epochs: 30 x 14 = 420 before 500
    cfg = load_config("verl", ["trainer.total_training_steps=500"])
    assert cfg.trainer.total_epochs == 30
    assert total_steps(cfg, batches_per_epoch=14) == 420
    # the GRPO recipe's 24 steps are unchanged (the arithmetic set: 1000 rows / 8 = 125 batches)
    assert total_steps(load_config(), batches_per_epoch=125) == 24
    # steps alone over the recipe are not cut to one epoch: the epochs default is verl's 30
    assert total_steps(load_config(overrides=["trainer.total_training_steps=200"]), batches_per_epoch=125) == 200


def test_run_management_is_checked_at_load_before_any_model(tmp_path, monkeypatch):
    import importlib.util

    with pytest.raises(ConfigError, match=r"trainer.logger has unknown backend 'mlflow'; choose from \['console', "
                                          r"'jsonl', 'tensorboard', 'wandb'\]"):
        load_config(overrides=["trainer.logger=[console,mlflow]"])
    with pytest.raises(ConfigError, match=r"reward.functions\[1\].name = 'arithmatic' is not a registered reward "
                                          r"function; choose one of \['arithmetic', "):
        load_config(overrides=["reward.functions=[{name: correctness},{name: arithmatic}]"])
    with pytest.raises(ConfigError, match=r"reward.val_functions\[0\].name = 'acc' is not a registered"):
        load_config(overrides=["reward.val_functions=[{name: acc}]"])
    with pytest.raises(ConfigError, match=r"reward.custom_reward_function.path and reward.functions both"):
        load_config(overrides=["reward.functions=[{name: correctness}]", "reward.custom_reward_function.path=my.py"])
    (tmp_path / "global_step_2").mkdir()
    with pytest.raises(ConfigError, match=r"trainer.resume_mode = '.*global_step_2': .* is not a checkpoint folder "
                                          r"\(no trainer_state.pt\); use auto"):
        load_config(overrides=[f"trainer.resume_mode={tmp_path / 'global_step_2'}"])
    # verl's resume_mode=resume_path names the folder in resume_from_path: read as rlvr's resume_mode=<folder>
    with pytest.raises(ConfigError, match=r"trainer.resume_mode = '.*global_step_2': .* is not a checkpoint folder"):
        load_config(overrides=["trainer.resume_mode=resume_path",
                               f"trainer.resume_from_path={tmp_path / 'global_step_2'}"])
    (tmp_path / "global_step_2" / "trainer_state.pt").write_bytes(b"")
    assert load_config(overrides=[f"trainer.resume_mode={tmp_path / 'global_step_2'}"]).trainer.resume_mode.endswith(
        "global_step_2")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"trainer.logger includes wandb but the wandb package is not installed: "
                                          r"pip install 'rlvr\[wandb\]'"):
        load_config(overrides=["trainer.logger=[console,wandb]"])


def test_a_reward_model_on_ray_gpus_is_refused_at_load(tmp_path):
    ray_gpus = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=fsdp2", "reward.reward_model.enable=true",
                f"reward.reward_model.path={tmp_path}"]
    for device in ("cuda", "auto"):  # auto finds the workers' GPUs; the trainer's Ray actor holds none
        with pytest.raises(ConfigError, match=r"reward.reward_model.enable=true on Ray .* the reward model would run "
                                              r"in the trainer's Ray actor, which holds no GPU"):
            load_config(overrides=[*ray_gpus, f"trainer.device={device}"])
    with pytest.raises(ConfigError, match="on Ray"):  # a rollout pool of its own is Ray too
        load_config(overrides=["actor_rollout_ref.hybrid_engine=false", "trainer.device=cuda",
                               "reward.reward_model.enable=true", f"reward.reward_model.path={tmp_path}"])
    assert load_config(overrides=[*ray_gpus, "trainer.device=cpu"]).reward.reward_model.enable  # scored on the CPU
    one_gpu = load_config(overrides=["trainer.device=cuda", "reward.reward_model.enable=true",
                                     f"reward.reward_model.path={tmp_path}"])
    assert one_gpu.reward.reward_model.enable  # one device: the reward model shares the trainer's process and GPU
    with pytest.raises(ConfigError, match=r"reward.reward_model.enable=true needs reward.reward_model.path"):
        load_config(overrides=["reward.reward_model.enable=true"])


def test_a_custom_file_has_the_same_module_name_in_every_process(tmp_path):
    """hash() of a string is salted per process; the module name of a custom file must not be,
    or a function pickled by one process names a module another process does not have."""
    import subprocess
    import sys

    from rlvr.registry import import_file

    custom = tmp_path / "custom_reward.py"
    custom.write_text("def score(*args, **kwargs):\n    return 1.0\n")
    here = import_file(custom, "rlvr_custom").__name__
    code = f"from pathlib import Path\nfrom rlvr.registry import import_file\nprint(import_file(Path({str(custom)!r}), 'rlvr_custom').__name__)"
    names = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout.strip()
             for seed in ("1", "2")}
    assert names == {here}


def test_auto_precision_follows_the_device():
    """verl computes in bf16 on GPUs; on a CPU bf16 matmuls are ~5x slower than fp32 here."""
    keys = ("actor", "rollout", "fsdp")

    def dtypes(cfg):
        arr = cfg.actor_rollout_ref
        return dict(zip(keys, (arr.actor.dtype, arr.rollout.dtype, arr.actor.fsdp_config.mixed_precision.param_dtype)))

    assert dtypes(load_config(overrides=["trainer.device=cpu"])) == dict.fromkeys(keys, "float32")
    assert dtypes(load_config(overrides=["trainer.device=cuda"])) == dict.fromkeys(keys, "bfloat16")
    # set by the user: kept as set, on either device
    kept = load_config(overrides=["trainer.device=cuda", "actor_rollout_ref.rollout.dtype=float32"])
    assert dtypes(kept) == {"actor": "bfloat16", "rollout": "float32", "fsdp": "bfloat16"}
    assert "dtype: auto" not in to_yaml(kept)  # the saved config states the precision used
    # the reduction stays fp32 (verl's), auto or not
    assert load_config(overrides=["trainer.device=cuda"]).actor_rollout_ref.actor.fsdp_config.mixed_precision \
        .reduce_dtype == "float32"


@pytest.mark.parametrize("setting", ["gpu_memory_utilization=0.6", "enforce_eager=false", "enable_prefix_caching=false", "free_cache_engine=false",
                                     "tensor_model_parallel_size=2"])
def test_the_native_engine_refuses_vllm_settings(setting):
    """A vLLM key on the native engine would do nothing: refused with what to do instead."""
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"rollout.{key} = .* is a vLLM setting the native engine does not read "
                                          r"\(.*\); remove it or set actor_rollout_ref.rollout.name=vllm"):
        load_config(overrides=[f"actor_rollout_ref.rollout.{setting}"])


def test_rollout_engine_names(capsys):
    with pytest.raises(ConfigError, match="name=sglang runs as servers: set actor_rollout_ref.rollout.mode=async"):
        load_config(overrides=["actor_rollout_ref.rollout.name=sglang"])
    with pytest.raises(ConfigError, match=r"rollout.name = 'hf' is not one of \['native', 'vllm'\]"):
        load_config(overrides=["actor_rollout_ref.rollout.name=hf"])
    # the recipe's prompts of up to 128 tokens and responses of up to 64 need 192 positions
    with pytest.raises(ConfigError, match=r"max_model_len = 191 is shorter than data.max_prompt_length \+ "
                                          r"data.max_response_length = 192"):
        load_config(overrides=["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.max_model_len=191"])
    with pytest.raises(ConfigError, match=r"max_model_len = 191 is shorter"):  # the native engine core reads it too
        load_config(overrides=["actor_rollout_ref.rollout.max_model_len=191"])
    assert load_config(overrides=["actor_rollout_ref.rollout.max_model_len=512"]).actor_rollout_ref.rollout.max_model_len == 512
    cfg = load_config(overrides=["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.max_num_batched_tokens=2048"])
    assert cfg.actor_rollout_ref.rollout.max_num_batched_tokens == 2048
    # vLLM on a CPU prefills whole prompts (a seeded request fails on a split one): a step's budget
    # below the 192 positions is refused at load, in process and for the vllm serve replicas rlvr starts
    for mode in ("sync", "async"):
        with pytest.raises(ConfigError, match=r"max_num_batched_tokens = 191 is less than max_model_len 192: vLLM on "
                                              r"a CPU prefills each prompt in one step.*at least 192 or leave it null"):
            load_config(overrides=["actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.mode={mode}",
                                   "trainer.device=cpu", "actor_rollout_ref.rollout.max_num_batched_tokens=191"])
    load_config(overrides=["actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu",
                           "actor_rollout_ref.rollout.max_num_batched_tokens=192"])
    capsys.readouterr()
    load_config(overrides=["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",  # the user's server
                           "actor_rollout_ref.rollout.external_server_addresses=[127.0.0.1:30000]",
                           "trainer.device=cpu"])
    # which gets no seed from a CPU trainer, and the console says so; replicas rlvr starts get them, silently
    assert "external_server_addresses with name=vllm from a CPU trainer: the requests carry no seed" in capsys.readouterr().err
    load_config(overrides=["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async",
                           "trainer.device=cpu"])
    assert "carry no seed" not in capsys.readouterr().err


VLLM = "actor_rollout_ref.rollout.name=vllm"
ASYNC = "actor_rollout_ref.rollout.mode=async"
EXTERNAL = "actor_rollout_ref.rollout.external_server_addresses=[127.0.0.1:30000]"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vllm_refuses_the_native_engines_lean_decode(mode):
    """lean_decode is the native engine's decode step (and its rlvr serve replicas'): with vLLM it
    would do nothing."""
    with pytest.raises(ConfigError, match=r"rollout.lean_decode = False is read by the native engine only .*"
                                          r"remove it or set actor_rollout_ref.rollout.name=native"):
        load_config(overrides=[VLLM, f"actor_rollout_ref.rollout.mode={mode}", "actor_rollout_ref.rollout.lean_decode=false"])
    load_config(overrides=["actor_rollout_ref.rollout.lean_decode=false"])  # the native engine reads it


@pytest.mark.parametrize("setting", ["weight_sync=disk", "weights_dir=/tmp/weights", "max_attempts=5",
                                     "retry_delay=0.5", "max_connections=10", "api_key=secret"])
def test_server_settings_without_servers_are_refused(setting):
    """rollout.server's request, retry and weight settings are read by rollout servers only; with
    mode=sync they would do nothing."""
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"rollout.server.{key} = .* is read by rollout servers only "
                                          r"\(rollout.mode=async\).*remove it or set actor_rollout_ref.rollout.mode=async"):
        load_config(overrides=[f"actor_rollout_ref.rollout.server.{setting}"])
    load_config(overrides=[ASYNC, f"actor_rollout_ref.rollout.server.{setting}"])


def test_server_timeouts_load_without_servers():
    """timeout and max_start_wait_time are read by served distillation teachers too, in any mode."""
    cfg = load_config(overrides=["actor_rollout_ref.rollout.server.timeout=30",
                                 "actor_rollout_ref.rollout.server.max_start_wait_time=60"])
    assert cfg.actor_rollout_ref.rollout.server.timeout == 30


def test_vllm_serve_replicas_refuse_free_cache_engine():
    """vllm serve replicas never sleep between rollouts: free_cache_engine would do nothing."""
    with pytest.raises(ConfigError, match=r"rollout.free_cache_engine = False does nothing with "
                                          r"actor_rollout_ref.rollout.mode=async.*vllm serve replicas"):
        load_config(overrides=[VLLM, ASYNC, "actor_rollout_ref.rollout.free_cache_engine=false"])
    load_config(overrides=[VLLM, "actor_rollout_ref.rollout.free_cache_engine=false"])  # in process: read


@pytest.mark.parametrize("setting", ["max_num_seqs=64", "max_num_batched_tokens=4096", "max_model_len=4096",
                                     "gpu_memory_utilization=0.8", "enforce_eager=false",
                                     "enable_prefix_caching=false", "dtype=bfloat16"])
def test_settings_of_the_replicas_rlvr_starts_are_refused_for_external_vllm_servers(setting):
    """These keys only build the command that starts a replica: a server rlvr did not start has its
    own. (dtype: bfloat16 on this CPU machine differs from what auto resolves to, float32.)"""
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"rollout.{key} = .* sets up the servers rlvr starts.*"
                                          r"external_server_addresses.*set it where the servers are started"):
        load_config(overrides=[VLLM, ASYNC, EXTERNAL, "trainer.device=cpu", f"actor_rollout_ref.rollout.{setting}"])
    load_config(overrides=[VLLM, ASYNC, "trainer.device=cpu", f"actor_rollout_ref.rollout.{setting}"])  # replicas


@pytest.mark.parametrize("setting", ["max_num_seqs=64", "lean_decode=false"])
def test_settings_of_the_replicas_rlvr_starts_are_refused_for_external_native_servers(setting):
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"rollout.{key} = .* sets up the servers rlvr starts"):
        load_config(overrides=[ASYNC, EXTERNAL, f"actor_rollout_ref.rollout.{setting}"])
    load_config(overrides=[ASYNC, f"actor_rollout_ref.rollout.{setting}"])  # the rlvr serve replicas read it


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vllm_refuses_temperatures_it_would_raise_to_0_01(mode):
    """vLLM's SamplingParams raises 0 < T < 0.01 to 0.01: the rollout's log-probs would be of T = 0.01
    and the actor's of T. Greedy validation (T = 0) is untouched, and the native engine samples at T."""
    on = [VLLM, f"actor_rollout_ref.rollout.mode={mode}"]
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.temperature = 0.005: vLLM raises a temperature "
                                          r"in \(0, 0.01\) to 0.01"):
        load_config(overrides=[*on, "actor_rollout_ref.rollout.temperature=0.005"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.val_kwargs.temperature = 0.001: vLLM raises"):
        load_config(overrides=[*on, "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                               "actor_rollout_ref.rollout.val_kwargs.temperature=0.001"])
    cfg = load_config(overrides=[*on, "actor_rollout_ref.rollout.val_kwargs.temperature=0"])  # greedy validation
    assert not cfg.actor_rollout_ref.rollout.val_kwargs.do_sample
    load_config(overrides=[*on, "actor_rollout_ref.rollout.temperature=0.01"])
    load_config(overrides=["actor_rollout_ref.rollout.temperature=0.005"])  # the native engine samples at T


@pytest.mark.parametrize("key", ["top_k", "val_kwargs.top_k"])
def test_top_k_below_minus_1_is_refused(key):
    """-1 and 0 turn top-k off (the engines read both so); below -1 a vLLM or SGLang server answers 400."""
    with pytest.raises(ConfigError, match=rf"actor_rollout_ref.rollout.{key} = -2: use -1 or 0 \(off\) or a "
                                          r"number of tokens >= 1"):
        load_config(overrides=[f"actor_rollout_ref.rollout.{key}=-2"])
    for value in (-1, 0, 5):
        load_config(overrides=[f"actor_rollout_ref.rollout.{key}={value}"])


def test_verl_strategy_fsdp_is_fsdp2_and_several_devices_without_a_strategy_shard(capsys):
    # verl's default strategy is fsdp (sharded); its scripts set only trainer.n_gpus_per_node
    assert load_config(overrides=["trainer.n_gpus_per_node=2"]).actor_rollout_ref.actor.strategy == "fsdp2"
    assert load_config().actor_rollout_ref.actor.strategy == "local"  # one device: rlvr's in-process actor
    capsys.readouterr()
    cfg = load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp"])
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    assert "actor_rollout_ref.actor.strategy=fsdp (verl's FSDP) is rlvr's fsdp2" in capsys.readouterr().err
    assert "strategy: fsdp2" in to_yaml(cfg)  # the saved config says which


def test_vllm_tensor_parallel_must_divide_the_devices():
    cfg = load_config(overrides=["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=2",
                                 "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.device=cpu"])
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size = 4 must be >= 1 and divide the 2 devices"):
        load_config(overrides=["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=2",
                               "actor_rollout_ref.rollout.tensor_model_parallel_size=4"])


VERL_SCRIPT_KEYS = [  # keys verl's current example scripts set that change nothing in rlvr's results
    "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=24000",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "critic.model.use_remove_padding=True",
    "critic.use_dynamic_bsz=True",
    "critic.ppo_max_token_len_per_gpu=98304",
    "critic.strategy=fsdp2",
    "critic.model.fsdp_config.param_offload=False",
    "trainer.balance_batch=True",
    "trainer.use_legacy_worker_impl=auto",
    "trainer.ray_wait_register_center_timeout=300",
    "ray_kwargs.timeline_json_file=null",
]


def test_verl_script_keys_are_noticed_once_with_what_rlvr_does_instead(capsys):
    from rlvr.config.loader import VERL_NO_EFFECT

    load_config(overrides=VERL_SCRIPT_KEYS)
    err = capsys.readouterr().err
    assert "did you mean" not in err
    assert err.count("[rlvr] note: verl settings (from the command line) that have no effect in rlvr:") == 1
    for item in VERL_SCRIPT_KEYS:  # each key, or the section it belongs to, is named in the notice
        key = item.split("=")[0]
        assert any(key == entry or key.startswith(entry + ".") for entry in VERL_NO_EFFECT if entry in err), key
    assert "critic.model.fsdp_config.param_offload: the critic is sharded like the actor" in err  # not "replicated"
    # one line per reason: the two critic micro-batch keys share theirs
    assert "critic.use_dynamic_bsz, critic.ppo_max_token_len_per_gpu: the critic's micro-batches" in err
    assert len(err.strip().splitlines()) < len(VERL_SCRIPT_KEYS)


def test_a_verl_key_asking_for_what_rlvr_does_not_do_is_refused():
    with pytest.raises(ConfigError, match=r"ray_kwargs.timeline_json_file='t.json' .* cannot be honoured: no Ray "
                                          r"timeline is written"):
        load_config(overrides=["ray_kwargs.timeline_json_file=t.json"])


def test_the_critic_steps_like_the_actor_unless_told_otherwise():
    # verl: critic.ppo_mini_batch_size = ${actor.ppo_mini_batch_size}, ppo_epochs likewise; its PPO scripts
    # set only the actor's (256 of 1024 prompts: 4 critic steps a step, not 128 of rlvr's old default 8)
    cfg = load_config(overrides=["algorithm.adv_estimator=gae", "data.train_batch_size=16",
                                 "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_epochs=2"])
    assert (cfg.critic.ppo_mini_batch_size, cfg.critic.ppo_epochs) == (4, 2)
    cfg = load_config(overrides=["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=2", "critic.ppo_epochs=3"])
    assert (cfg.critic.ppo_mini_batch_size, cfg.critic.ppo_epochs) == (2, 3)
    with pytest.raises(ConfigError, match="critic.ppo_mini_batch_size = 3 prompts cannot be split evenly over 2 devices"):
        load_config(overrides=["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=3",
                               "trainer.n_gpus_per_node=2", "trainer.device=cpu"])


def test_ppo_without_a_group_size_samples_one_response_per_prompt_as_verl(capsys):
    # verl's PPO scripts (examples/ppo_trainer) set adv_estimator=gae and no rollout.n: verl's default 1,
    # not the GRPO recipe's groups of 8 (8 times the rollouts)
    cfg = load_config(overrides=["algorithm.adv_estimator=gae"])
    assert cfg.actor_rollout_ref.rollout.n == 1
    assert "rollout.n=1 (verl's default for PPO; the GRPO recipe's groups of 8 are dropped)" in capsys.readouterr().err
    assert load_config(overrides=["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=4"]) \
        .actor_rollout_ref.rollout.n == 4
    assert load_config(overrides=["actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=gae"]) \
        .actor_rollout_ref.rollout.n == 4  # order on the command line does not matter


def test_a_run_of_no_steps_is_refused():
    """total_training_steps=0 used to build the whole run, train nothing and say it was "already
    complete"; null is verl's "from total_epochs", so 0 (and 0 epochs) is refused with both ways out."""
    with pytest.raises(ConfigError, match=r"trainer.total_training_steps = 0: a run trains at least 1 step; set it "
                                          r">= 1, or to null to train trainer.total_epochs epochs \(as in verl\)"):
        load_config(overrides=["trainer.total_training_steps=0"])
    with pytest.raises(ConfigError, match=r"trainer.total_epochs = 0: a run trains at least 1 epoch"):
        load_config(overrides=["trainer.total_training_steps=null", "trainer.total_epochs=0"])
    # with steps set too: the run ends at the first of the two, so 0 epochs is still 0 steps
    with pytest.raises(ConfigError, match=r"trainer.total_epochs = 0: a run trains at least 1 epoch"):
        load_config(overrides=["trainer.total_training_steps=5", "trainer.total_epochs=0"])
    assert load_config(overrides=["trainer.total_training_steps=null"]).trainer.total_epochs == 30  # verl's default


def test_the_checkpoint_engine_acts_on_a_rollout_pool_and_is_noted_without_one(capsys):
    bucket = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096"
    assert load_config(overrides=[bucket]).actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes == 4096
    assert "checkpoint_engine (from the command line) has no effect with hybrid_engine=true" in capsys.readouterr().err
    load_config(overrides=[bucket, "actor_rollout_ref.hybrid_engine=false", "trainer.device=cpu"])
    assert "checkpoint_engine" not in capsys.readouterr().err  # read: the broadcast's bucket size
    for override, message in (("backend=nixl", "gloo \\(CPU\\) or nccl"), ("backend=gloo", "no effect with"),
                              ("engine_kwargs={a: 1}", "take none"), ("custom_backend_module=x", "plug-in")):
        with pytest.raises(ConfigError, match=message):
            load_config(overrides=[f"actor_rollout_ref.rollout.checkpoint_engine.{override}"])
    with pytest.raises(ConfigError, match="nccl needs CUDA"):
        load_config(overrides=["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "trainer.device=cpu",
                               "actor_rollout_ref.hybrid_engine=false"])


@pytest.mark.parametrize("section", ["actor_rollout_ref.actor", "critic"])
@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_a_gradient_clip_that_is_not_positive_is_refused(section, value):
    """torch's clip_grad_norm_ scales every gradient by min(1, grad_clip / norm): at -1 the factor
    is -1 / norm, so the step goes against the gradient (the update trains backwards, cosine -0.9997
    to the step at 1.0 in the report); at 0 every gradient becomes 0; NaN makes them NaN. verl passes
    the value to the same function, so it has no reading of <= 0 to follow: refused, with the way to
    turn clipping off."""
    with pytest.raises(ConfigError, match=rf"{section}.grad_clip = {value}.*scales the gradients by "
                                          r"min\(1, grad_clip / norm\).*set a norm > 0 \(1.0 as verl\)"):
        load_config(overrides=[f"{section}.grad_clip={value}", "algorithm.adv_estimator=gae"])
    # infinity is how to turn clipping off: min(1, inf / norm) = 1, the gradients as they are
    cfg = load_config(overrides=[f"{section}.grad_clip=.inf"])
    assert (cfg.critic if section == "critic" else cfg.actor_rollout_ref.actor).grad_clip == float("inf")


@pytest.mark.parametrize("override", ["actor_rollout_ref.rollout.do_sample=false", "actor_rollout_ref.rollout.top_k=1",
                                      "actor_rollout_ref.rollout.min_p=1.0"])
def test_sampling_that_makes_every_group_identical_is_refused(override):
    """Greedy training rollouts (do_sample=false, top_k=1, min_p=1: only the likeliest token is
    kept) give n identical responses per prompt, so every group's rewards tie, every advantage is
    0 and nothing trains ("groups without signal 4" at every step); refused as temperature=0 is,
    with greedy validation (val_kwargs.do_sample=false) named as the key that stays allowed."""
    with pytest.raises(ConfigError, match=r"decodes greedily: the n responses of a prompt are identical, so every "
                                          r"group's rewards tie.*nothing trains.*val_kwargs.do_sample=false"):
        load_config(overrides=[override])


@pytest.mark.parametrize("min_p", ["1.5", "-0.1"])
def test_min_p_outside_its_range_is_refused(min_p):
    with pytest.raises(ConfigError, match=rf"actor_rollout_ref.rollout.min_p = {min_p} must be in \[0, 1\)"):
        load_config(overrides=[f"actor_rollout_ref.rollout.min_p={min_p}"])


def test_greedy_validation_and_untruncated_sampling_stay_allowed():
    cfg = load_config(overrides=["actor_rollout_ref.rollout.val_kwargs.do_sample=false",
                                 "actor_rollout_ref.rollout.top_k=2", "actor_rollout_ref.rollout.min_p=0.5"])
    assert (cfg.actor_rollout_ref.rollout.val_kwargs.do_sample, cfg.actor_rollout_ref.rollout.top_k) == (False, 2)


@pytest.mark.parametrize("key", ["trainer.experiment_name", "trainer.project_name"])
@pytest.mark.parametrize("value", ["''", "'  '"])
def test_an_empty_run_name_is_refused(key, value):
    """An empty experiment_name made the run folder runs/rlvr/ itself, the parent of every other run's."""
    with pytest.raises(ConfigError, match=rf"{key} is empty: it names the run's folder"):
        load_config(overrides=[f"{key}={value}"])


@pytest.mark.parametrize("override", ["actor_rollout_ref.actor.clip_ratio=nan", "actor_rollout_ref.rollout.min_p=nan",
                                      "actor_rollout_ref.actor.entropy_coeff=.inf", "algorithm.gamma=-.inf",
                                      "actor_rollout_ref.actor.clip_ratio_high=.nan"])
def test_a_number_that_is_nan_or_inf_is_refused(override):
    """NaN passes every `value < 0` check: a NaN clip_ratio loaded, and torch.clamp with NaN bounds
    makes every clipped ratio, so every loss, NaN; a NaN min_p kept every token. Refused by key."""
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key} = -?(nan|inf): must be a finite number"):
        load_config(overrides=[override])


@pytest.mark.parametrize("key", ["actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.kl_coef"])
def test_a_negative_kl_coefficient_is_refused(key):
    """A negative coefficient turns the KL penalty into a reward for leaving the reference."""
    with pytest.raises(ConfigError, match=rf"{key} = -0.01: a negative coefficient rewards moving away"):
        load_config(overrides=[f"{key}=-0.01"])
    assert load_config(overrides=[f"{key}=0"])  # 0 drops the term


@pytest.mark.parametrize("key", ["data.seed", "actor_rollout_ref.rollout.seed", "trainer.seed"])
def test_a_negative_seed_is_refused(key):
    """data.seed=-1 loaded, then the sampler's numpy generator raised "expected non-negative integer"
    as a traceback at the first batch."""
    with pytest.raises(ConfigError, match=rf"{key} = -1: a seed must be >= 0"):
        load_config(overrides=[f"{key}=-1"])


@pytest.mark.parametrize("override,message", [("algorithm.kl_ctrl.horizon=0", "horizon = 0: .*set it > 0"),
                                              ("algorithm.kl_ctrl.target_kl=0", "target_kl = 0.0: .*set it > 0")])
def test_an_adaptive_kl_controller_that_cannot_work_is_refused_at_load(override, message):
    """horizon 0 was refused only when the trainer was built, after the models loaded; target_kl 0
    raised ZeroDivisionError at step 1."""
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", override])
    load_config(overrides=[override])  # the fixed controller reads neither


def test_a_hydra_flow_mapping_without_spaces_sets_its_keys():
    """YAML reads {attention_dropout:0.1} as the key 'attention_dropout:0.1' with no value, so the
    override set nothing; Hydra, whose syntax verl's scripts use, reads it as a mapping."""
    cfg = load_config(overrides=["actor_rollout_ref.model.override_config={attention_dropout:0.1,rope_theta:500000}"])
    assert cfg.actor_rollout_ref.model.override_config == {"attention_dropout": 0.1, "rope_theta": 500000}
    from rlvr.config.loader import parse_overrides
    assert parse_overrides(['a={b:{c:2},d:"x:y",e:[1,2]}']) == {"a": {"b": {"c": 2}, "d": "x:y", "e": [1, 2]}}


def test_apply_chat_template_kwargs_are_read_as_verl_writes_them():
    # verl's line for Qwen3 without thinking: +data.apply_chat_template_kwargs.enable_thinking=False
    cfg = load_config(overrides=["+data.apply_chat_template_kwargs.enable_thinking=False"])
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False}
    cfg = load_config(overrides=["data.apply_chat_template_kwargs={enable_thinking: false, reasoning_effort: low}"])
    assert cfg.data.apply_chat_template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}
    # an argument rlvr passes itself would reach apply_chat_template twice (a TypeError at the first row)
    with pytest.raises(ConfigError, match=r"data.apply_chat_template_kwargs.add_generation_prompt: an argument rlvr "
                                          r"sets itself"):
        load_config(overrides=["+data.apply_chat_template_kwargs.add_generation_prompt=false"])
