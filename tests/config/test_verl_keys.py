"""Every key of verl's generated trainer config is known to rlvr (issue 48 §3).

``verl_generated_keys.txt`` is the key list of verl's ``_generated_ppo_trainer.yaml`` (its commit in
the header). Each key is read (a schema key, or verl's spelling of one), accepted with a notice as
having no effect, refused with the reason and what to use, or passed to Ray. None is unknown.
"""

import types
from pathlib import Path

import pytest

from rlvr.config import ConfigError, load_config
from rlvr.config.loader import _multimodal, _verl_entry, _verl_keys, known_keys
from rlvr.config.verl_keys import TEXT_ONLY, VERL_ALIASES, VERL_READ_AT_LOAD, VERL_RENAMED

KEYS_FILE = Path(__file__).parent / "verl_generated_keys.txt"
VERL_KEYS = [line for line in KEYS_FILE.read_text().splitlines() if line and not line.startswith("#")]


def _ancestors(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def classify(key: str) -> str:
    schema = known_keys()
    if key in schema:
        return "read"
    if key in VERL_ALIASES:
        return "read as " + VERL_ALIASES[key]
    if key in VERL_READ_AT_LOAD:  # read with verl's meaning once every layer is merged
        return "read as " + VERL_READ_AT_LOAD[key]
    if _multimodal(key, "an image setting"):
        return "refused: " + TEXT_ONLY
    if key.startswith("ray_kwargs.ray_init."):
        return "passed to ray.init"
    for node in reversed(_ancestors(key)):  # outermost first, as the loader walks
        if node in VERL_RENAMED:
            return "refused: " + VERL_RENAMED[node]
        if node not in schema and _verl_entry(node) is not None:
            return "no effect: " + _verl_entry(node)[0]
    return "unknown"


def test_the_key_list_is_verls_whole_generated_config():
    # 556 keys at the commit in the header; a few that anyone would look for are there
    assert len(VERL_KEYS) == 556 and "b178a3cd56f58b2d502255daba591e92833930a7" in KEYS_FILE.read_text()
    for key in ("actor_rollout_ref.actor.optim.lr", "reward_model.enable", "ray_kwargs.ray_init.num_cpus",
                "actor_rollout_ref.rollout.multi_stage_wake_up", "global_profiler.steps"):
        assert key in VERL_KEYS


def test_no_key_of_verls_generated_config_is_unknown():
    unknown = [key for key in VERL_KEYS if classify(key) == "unknown"]
    assert unknown == []


def test_the_classification_is_not_all_no_effect():
    # the walk means something only if most keys are read: 137 were schema keys before this table
    kinds = [classify(key).split(":")[0].split(" ")[0] for key in VERL_KEYS]
    assert kinds.count("read") >= 145  # 137 schema keys + verl spellings read
    assert classify("reward_model.enable") == "read as reward.reward_model.enable"
    assert classify("actor_rollout_ref.actor.ppo_micro_batch_size").startswith(
        "read as actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = "
        "actor_rollout_ref.actor.ppo_micro_batch_size // ")
    assert classify("data.image_key").startswith("refused")


def _nested(key: str, value) -> dict:
    *parents, last = key.split(".")
    data = node = {}
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def _harmless_value_drops_and_other_value_is_refused(key: str) -> str:
    """The key (under the entry that covers it) is dropped at a harmless value and refused at another;
    returns the key the entry names."""
    schema = known_keys()  # the walk meets the outermost entry first: a section's covers its sub-keys
    entry_key = next(node for node in reversed(_ancestors(key)) if node not in schema and _verl_entry(node))
    why, harmless = _verl_entry(entry_key)
    data = _nested(entry_key, harmless[0]) if harmless else _nested(key, "anything")
    _verl_keys(data, "the test")
    assert data == {}, key  # dropped, and the sections it emptied with it
    if harmless:
        with pytest.raises(ConfigError, match=f"{entry_key}='a value verl would act on' \\(from the test\\) cannot be honoured: "
                                              ".*; remove it"):
            _verl_keys(_nested(entry_key, "a value verl would act on"), "the test")
    return entry_key


@pytest.mark.parametrize("key", [k for k in VERL_KEYS if classify(k).startswith("no effect")])
def test_each_no_effect_key_drops_with_a_notice_or_is_refused_with_the_reason(key, capsys):
    entry_key = _harmless_value_drops_and_other_value_is_refused(key)
    assert entry_key in capsys.readouterr().err  # the notice names it


@pytest.mark.parametrize("key, value", [
    ("actor_rollout_ref.actor.use_torch_compile", False),
    ("actor_rollout_ref.actor.fsdp_config.use_torch_compile", True),
    ("actor_rollout_ref.rollout.layered_summon", True),
    ("actor_rollout_ref.model.use_shm", True),
    ("data.use_shm", True),
    ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", 1),
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size", 32),
    ("actor_rollout_ref.rollout.multi_stage_wake_up", True),
    ("global_profiler.tool", "torch_memory"),
    ("actor_rollout_ref.rollout.over_sample_rate", 0.1),
])
def test_harmless_verl_keys_load_with_a_notice(key, value, capsys):
    # refused before issue 48 (unknown keys, or fsdp_size != -1)
    cfg = load_config(None, [f"{key}={value}"])
    assert cfg.data.train_batch_size == 8  # the recipe's, untouched
    assert key in capsys.readouterr().err


@pytest.mark.parametrize("key, value, reason", [
    ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", 2, "sequence parallelism"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 4, "sequence parallelism"),
    ("trainer.log_val_generations", 10, "rlvr rollout"),
    ("global_profiler.steps", "[1,2]", "no profiler hooks"),
])
def test_verl_settings_rlvr_cannot_honour_are_refused_with_the_reason(key, value, reason):
    with pytest.raises(ConfigError, match=reason):
        load_config(None, [f"{key}={value}"])


def test_every_refusal_of_a_layer_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=4", "trainer.log_val_generations=10"])
    assert "ulysses_sequence_parallel_size=4" in str(err.value) and "log_val_generations=10" in str(err.value)


def test_dapo_overlong_keys_are_read_as_rlvrs(capsys):
    # verl's DAPO scripts: +reward_model.reward_kwargs.overlong_buffer_cfg.* (and the recipe's reward_model.overlong_buffer.*)
    cfg = load_config(None, ["reward_model.reward_manager=dapo",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.len=32",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
                             "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
                             "+reward_model.reward_kwargs.max_resp_len=64"])
    assert (cfg.reward.overlong_buffer.enable, cfg.reward.overlong_buffer.len,
            cfg.reward.overlong_buffer.penalty_factor) == (True, 32, 0.5)
    cfg = load_config(None, ["reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=16"])
    assert cfg.reward.overlong_buffer.enable and cfg.reward.overlong_buffer.len == 16
    with pytest.raises(ConfigError, match="max_resp_len=128 .* differs from data.max_response_length=64"):
        load_config(None, ["data.max_response_length=64", "+reward_model.reward_kwargs.max_resp_len=128"])
    # the response length from another layer (the recipe's 64 here; verl.yaml's 512 under main_ppo): refused
    # too (the key was dropped with a notice and the penalty ended elsewhere than asked)
    with pytest.raises(ConfigError, match="max_resp_len=4096 .* differs from data.max_response_length=64"):
        load_config(None, ["+reward_model.reward_kwargs.max_resp_len=4096"])


def test_verls_reward_model_section_is_read():
    cfg = load_config(None, ["reward_model.enable=True", "reward_model.model.path=/models/rm",
                             "reward_model.micro_batch_size_per_gpu=4", "reward_model.use_reward_loop=True",
                             "reward_model.rollout.name=vllm", "reward_model.rollout.tensor_model_parallel_size=1",
                             "reward_model.num_workers=8"])
    rm = cfg.reward.reward_model
    assert (rm.enable, rm.path, rm.micro_batch_size_per_gpu) == (True, "/models/rm", 4)
    with pytest.raises(ConfigError, match=r"reward_model.max_length=512 \(from the command line\) cannot be honoured"):
        load_config(None, ["reward_model.max_length=512"])


def test_ray_init_keys_reach_ray_init(monkeypatch, tmp_path):
    """verl's ``ray_kwargs.ray_init.*`` (runtime_env and ray.init's other arguments) are passed to ray.init."""
    cfg = load_config(None, ["+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=1",
                             "+ray_kwargs.ray_init.runtime_env.working_dir=/tmp/job",
                             "+ray_kwargs.ray_init.namespace=rl", "ray_kwargs.ray_init.num_cpus=3"])
    assert cfg.ray_kwargs.ray_init.runtime_env == {"env_vars": {"MY_FLAG": 1}, "working_dir": "/tmp/job"}
    calls = []
    fake = types.SimpleNamespace(is_initialized=lambda: False, init=lambda **kw: calls.append(kw))
    import rlvr.distributed.ray_workers as ray_workers

    monkeypatch.setattr(ray_workers.tempfile, "tempdir", str(tmp_path))  # its rlvr-ray-* folder: not in /tmp
    monkeypatch.setattr(ray_workers, "ray", fake)
    ray_init = cfg.ray_kwargs.ray_init
    assert ray_workers.init_ray(ray_init.address, ray_init.num_cpus, tmp_path, ray_init.runtime_env, ray_init.kwargs)
    (kwargs,) = calls
    assert kwargs["runtime_env"] == {"env_vars": {"MY_FLAG": 1}, "working_dir": "/tmp/job"}
    assert kwargs["namespace"] == "rl" and kwargs["num_cpus"] == 3
    assert kwargs["_node_ip_address"] == "127.0.0.1"  # the local Ray still listens on loopback only


def test_the_local_ray_keeps_its_dashboard_off_whatever_is_given(monkeypatch, tmp_path):
    cfg = load_config(None, ["+ray_kwargs.ray_init.include_dashboard=true"])
    calls = []
    fake = types.SimpleNamespace(is_initialized=lambda: False, init=lambda **kw: calls.append(kw))
    import rlvr.distributed.ray_workers as ray_workers

    monkeypatch.setattr(ray_workers.tempfile, "tempdir", str(tmp_path))  # its rlvr-ray-* folder: not in /tmp
    monkeypatch.setattr(ray_workers, "ray", fake)
    ray_init = cfg.ray_kwargs.ray_init
    ray_workers.init_ray(None, None, tmp_path, ray_init.runtime_env, ray_init.kwargs)
    assert calls[0]["include_dashboard"] is False and calls[0]["_node_ip_address"] == "127.0.0.1"


def test_a_ray_init_key_ray_does_not_take_is_refused():
    with pytest.raises(ConfigError, match="ray_kwargs.ray_init.namespce .* not a keyword argument of ray.init; "
                                          "did you mean 'namespace'"):
        load_config(None, ["+ray_kwargs.ray_init.namespce=rl"])


def test_the_passed_ray_init_names_are_ray_inits_own():
    import inspect

    import ray

    from rlvr.config.loader import RAY_INIT_KWARGS

    params = set(inspect.signature(ray.init).parameters)
    assert {name for name in RAY_INIT_KWARGS if not name.startswith("_")} <= params


def test_fully_async_keys_left_out_take_verls_defaults(capsys):
    """verl's fully-async recipe: use_rollout_log_probs defaults to true (pi_old = the rollout's log-probs,
    rlvr's bypass mode) and trigger_parameter_sync_step to 4 (4 optimizer steps between weight loads)."""
    cfg = load_config(None, ["async_training.staleness_threshold=1", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                             "data.train_batch_size=0"])  # verl's fully-async scripts set 0: it reads no batch size
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    # 4 updates of 4 prompts between two loads: a step of 4 x 4 = 16 prompts, 16 / 4 = 4 mini-batches
    assert cfg.data.train_batch_size == 16 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4
    assert "trigger_parameter_sync_step=4 (verl's default)" in capsys.readouterr().err
    off = load_config(None, ["async_training.staleness_threshold=1", "async_training.use_rollout_log_probs=false",
                             "async_training.trigger_parameter_sync_step=2"])
    # the recipe's mini-batch of 8 prompts: 2 x 8 = 16
    assert off.algorithm.rollout_correction.bypass_mode is False and off.data.train_batch_size == 16


def test_fully_async_trigger_reads_the_mini_batch_of_an_earlier_layer(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 2\n")
    cfg = load_config(f, ["async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=3"])
    assert cfg.data.train_batch_size == 6  # 3 updates x 2 prompts


def test_fully_async_mode_follows_hybrid_engine_from_any_layer(tmp_path):
    """hybrid_engine=false in the file and async_training on the command line (or the other way
    round) is separate_async: the mode was chosen from the async layer alone, and the load then
    refused colocate_async beside a rollout pool of its own."""
    hybrid_off = tmp_path / "pool.yaml"
    hybrid_off.write_text("actor_rollout_ref:\n  hybrid_engine: false\n")
    cfg = load_config(hybrid_off, ["async_training.staleness_threshold=1"])
    assert cfg.trainer.v1.trainer_mode == "separate_async"
    async_file = tmp_path / "async.yaml"
    async_file.write_text("async_training:\n  staleness_threshold: 1\n")
    cfg = load_config(async_file, ["actor_rollout_ref.hybrid_engine=false"])
    assert cfg.trainer.v1.trainer_mode == "separate_async"
    assert load_config(async_file).trainer.v1.trainer_mode == "colocate_async"


def test_a_dict_valued_keys_entries_are_its_value_not_verl_keys(tmp_path):
    # reward_kwargs is the scorer's: a kwarg that happens to share a verl key's name (use_shm) is passed on
    scorer = tmp_path / "score.py"
    scorer.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                      "    return 1.0\n")
    cfg = load_config(None, [f"reward.custom_reward_function.path={scorer}",
                             "+reward.custom_reward_function.reward_kwargs.use_shm=true",
                             "+reward.custom_reward_function.reward_kwargs._target_=x"])
    assert cfg.reward.custom_reward_function.reward_kwargs == {"use_shm": True, "_target_": "x"}


def test_the_critics_fsdp_section_in_both_of_verls_layouts(capsys):
    # verl's newer scripts write critic.fsdp.*, older ones critic.model.fsdp_config.*
    load_config(None, ["critic.fsdp.param_offload=false", "critic.fsdp.optimizer_offload=false",
                       "critic.fsdp.use_torch_compile=false", "critic.model.fsdp_config.param_offload=false"])
    assert "critic.fsdp.param_offload" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"critic.fsdp.param_offload=True \(from the command line\) cannot be "
                                          r"honoured: the critic is sharded like the actor .* never offloaded"):
        load_config(None, ["critic.fsdp.param_offload=true"])


def test_the_chunked_prefill_notice_says_what_rlvr_does_on_a_cpu(capsys):
    """verl's enable_chunked_prefill: rlvr decides it, and on a CPU it turns vLLM's chunked prefill off
    (vllm_rollout.whole_prefill_tokens); the notice used to say vLLM always chunks."""
    load_config(None, ["actor_rollout_ref.rollout.enable_chunked_prefill=True"])
    err = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.enable_chunked_prefill" in err
    assert "on a CPU rlvr turns chunked prefill off" in err and "always chunks" not in err


@pytest.mark.slow  # deletes all 556 of verl's keys in one load: 7 s
def test_hydra_deletion_of_verl_keys(tmp_path):
    """Hydra's ``~key`` on a verl key: one rlvr has no key for (no effect, read at load) is deleted
    from every layer, as Hydra deletes it; one of ``VERL_ALIASES`` resets the rlvr key it is read as."""
    load_config("verl", ["~actor_rollout_ref.actor.ppo_micro_batch_size", "~trainer.critic_warmup"])
    load_config("verl", ["~actor_rollout_ref.rollout.log_prob_micro_batch_size", "~critic.ppo_micro_batch_size",
                         "~actor_rollout_ref.actor.fsdp_config.offload_policy", "~trainer.use_legacy_worker_impl"])
    # a file's value of a deleted verl key is gone: its 64 global rows are not read (they would give 64 // 8 = 8)
    user = tmp_path / "v.yaml"
    user.write_text("actor_rollout_ref:\n  actor:\n    ppo_micro_batch_size: 64\ntrainer:\n  critic_warmup: 5\n")
    plain = load_config("verl").actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    assert load_config(user, ["~trainer.critic_warmup"],
                       base="verl").actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8
    cfg = load_config(user, ["~actor_rollout_ref.actor.ppo_micro_batch_size", "~trainer.critic_warmup"], base="verl")
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == plain
    # an alias: the file's reward_model.enable=true (read as reward.reward_model.enable, which would need a
    # reward.reward_model.path) is reset to the schema default
    user.write_text("reward_model:\n  enable: true\n")
    with pytest.raises(ConfigError, match=r"reward.reward_model.enable=true needs reward.reward_model.path"):
        load_config(user, [])
    assert load_config(user, ["~reward_model.enable"]).reward.reward_model.enable is False
    # a setting after the deletion wins, in either spelling
    with pytest.raises(ConfigError, match=r"reward.reward_model.enable=true needs reward.reward_model.path"):
        load_config(user, ["~reward_model.enable", "reward.reward_model.enable=true"])
    # a misspelt key is still unknown, and not matched to a verl key
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.critic_warmupp' \(from the command line, ~"):
        load_config("verl", ["~trainer.critic_warmupp"])
    # every key of verl's generated config can be deleted
    load_config("verl", [f"~{key}" for key in VERL_KEYS])
