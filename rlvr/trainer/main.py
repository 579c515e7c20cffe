"""Build a training run from a config and run it: ``rlvr train`` calls ``run_training``.

Everything a run needs is built here, in the order a failure is cheapest to report: the
run directory, the tokenizer (a missing model path fails before any weights load), the
datasets (every row must have a scorable data_source), the workers, the reward managers.

One device (the default) runs everything in this process with ``LocalWorkerGroup``, where
``breakpoint()`` works anywhere. More devices (``trainer.n_gpus_per_node x nnodes > 1``), or a
Ray cluster (``ray_kwargs.ray_init.address``), run the same fit loop in a ``TaskRunner`` Ray
actor (the single controller) driving a ``RayWorkerGroup`` of colocated actor-rollout-ref (and
critic) workers, one process per device; the trainer cannot tell the groups apart.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from rlvr.agents import check_agent_names
from rlvr.config import ConfigError, to_yaml
from rlvr.config.loader import import_custom_modules
from rlvr.config.validate import drives_servers, ray_uses_gpu, uses_ray
from rlvr.config.schema import CustomRewardFunctionConfig, DataConfig, OverlongBufferConfig, RewardConfig, RLVRConfig
from rlvr.data import RLHFDataset
from rlvr.data.io import DatasetError
from rlvr.distributed import LocalWorkerGroup
from rlvr.distributed.weight_sync import open_channel
from rlvr.models import load_tokenizer
from rlvr.rewards import RewardManager
from rlvr.rollout import ToolSetup
from rlvr.tools.interaction import interaction_names
from rlvr.rewards.registry import needs_ground_truth, reward_fn_name_for, truth_check, truth_fits
from rlvr.errors import StopTraining, TrainingInterrupted
from rlvr.trainer import checkpoint
from rlvr.trainer.ppo_trainer import RLTrainer
from rlvr.trainer.memory_plan import on_gpu
from rlvr.trainer.run_folder import claim_run_folder, lock_run_folder, moved
from rlvr.trainer.tracking import Tracking
from rlvr.workers.critic import CriticWorker
from rlvr.workers.hybrid import ActorRolloutRefWorker, resolve_device
from rlvr.workers.rollout import RolloutWorker

DEFAULT_ARITHMETIC = [Path("~/data/arithmetic/train.parquet"), Path("~/data/arithmetic/test.parquet")]


def ensure_default_data(config: RLVRConfig) -> None:
    """The default run's arithmetic split is generated on first use (what ``rlvr prepare arithmetic`` writes)."""
    defaults = DataConfig()
    uses_default = config.data.train_files == defaults.train_files and config.data.val_files == defaults.val_files
    if uses_default and not all(p.expanduser().exists() for p in DEFAULT_ARITHMETIC):
        from rlvr.data.prepare import prepare_arithmetic

        out = DEFAULT_ARITHMETIC[0].expanduser().parent
        prepare_arithmetic(out)
        print(f"[rlvr] wrote the built-in arithmetic task to {out} (rlvr prepare arithmetic)", flush=True)


def is_empty(value) -> bool:
    """A ground truth with nothing to compare against: blank text, or an empty list or mapping."""
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple, dict, np.ndarray)):
        return len(value) == 0
    return False


def check_scorable(dataset: RLHFDataset, reward: RewardConfig, key: str, split: str) -> None:
    """Every row must be scorable: its data_source (the column ``key``) selects a reward function
    (unless functions are configured), and a function that compares against
    ``reward_model.ground_truth`` finds one it can compare (the function's registered
    ``TruthCheck``). Otherwise every sample of that row would fail to score, at every step."""
    if reward.custom_reward_function.path:
        return  # a user's function: rlvr cannot know what it reads
    fixed = [f.name for f in reward.functions] or None
    for row, origin in zip(dataset.rows, dataset.origins):
        source = row.get(key)
        try:
            names = fixed or [reward_fn_name_for(source)]
        except KeyError as err:
            raise DatasetError(f"{origin} ({split}): {err.args[0]}") from None
        truth = (row.get("reward_model") or {}).get("ground_truth")
        needing = [name for name in names if needs_ground_truth(name)]
        if needing and is_empty(truth):
            raise DatasetError(
                f"{origin} ({split}): key 'reward_model.ground_truth' is empty ({truth!r}), but the reward function "
                f"{needing[0]!r} (for data_source {source!r}) compares each response against it: every sample of "
                "this row would score as wrong, whatever it answers; fill it in or drop the row")
        if truth is None and needing:
            raise DatasetError(
                f"{origin} ({split}): key 'reward_model.ground_truth' is missing, but the reward function "
                f"{needing[0]!r} (for data_source {source!r}) compares each response against it; add "
                "\"reward_model\": {\"ground_truth\": ...} to every row (rlvr prepare writes it), or score with your "
                "own function (reward.custom_reward_function.path)")
        wrong = next((name for name in needing if not truth_fits(name, truth)), None)
        if wrong is not None:
            raise DatasetError(
                f"{origin} ({split}): key 'reward_model.ground_truth' is {truth!r} ({type(truth).__name__}), but the "
                f"reward function {wrong!r} (for data_source {source!r}) compares each response against "
                f"{truth_check(wrong).expects}: every sample of this row would fail to score, or score as wrong "
                "whatever it answers")


def check_interaction_names(dataset: RLHFDataset | None, names: list[str], split: str) -> None:
    """Every interaction a row's ``extra_info.interaction_kwargs.name`` names must be in the
    interaction config (a misspelt name would otherwise stop the run at its first rollout)."""
    if dataset is None or not names:
        return
    for row, origin in zip(dataset.rows, dataset.origins):
        kwargs = (row.get("extra_info") or {}).get("interaction_kwargs")
        if kwargs and (not isinstance(kwargs, dict) or kwargs.get("name") not in names):
            named = kwargs.get("name") if isinstance(kwargs, dict) else kwargs
            raise DatasetError(f"{origin} ({split}): extra_info.interaction_kwargs names interaction {named!r}, which "
                               f"the interaction config does not define (it defines {sorted(names)}); "
                               "interaction_kwargs needs a 'name'")


def check_tools_kwargs(dataset: RLHFDataset | None, tools: dict, split: str) -> None:
    """Every tool a row's ``extra_info.tools_kwargs`` names must be in the tools YAML."""
    for row, origin in zip(dataset.rows if dataset is not None else [], dataset.origins if dataset is not None else []):
        named = ((row.get("extra_info") or {}).get("tools_kwargs") or {})
        unknown = sorted(k for k, v in named.items() if v is not None and k not in tools)
        if unknown:
            raise DatasetError(f"{origin} ({split}): extra_info.tools_kwargs names tools {unknown} that the tool config "
                               f"does not define (it defines {sorted(tools)})")


def validation_reward_config(reward: RewardConfig) -> RewardConfig:
    """Validation scores with ``reward.val_functions`` when set, and never with the overlong penalty."""
    functions = reward.val_functions or reward.functions
    custom = reward.custom_reward_function if not reward.val_functions else CustomRewardFunctionConfig()
    return dataclasses.replace(reward, functions=functions, custom_reward_function=custom,
                               overlong_buffer=OverlongBufferConfig())


def total_steps(config: RLVRConfig, batches_per_epoch: int) -> int:
    """The run's length: ``total_epochs`` epochs, or ``total_training_steps`` if that comes first
    (verl's fit loop ends at whichever is reached first)."""
    by_epochs = batches_per_epoch * config.trainer.total_epochs
    if config.trainer.total_training_steps is not None:
        return min(config.trainer.total_training_steps, by_epochs)
    return by_epochs


def critic_args(config: RLVRConfig, steps: int, pad_id: int) -> tuple:
    actor = config.actor_rollout_ref.actor  # the critic is sharded like the actor
    return (config.critic, steps, pad_id, config.trainer.device, config.trainer.seed, actor.loss_agg_mode,
            actor.strategy, actor.fsdp_config.mixed_precision, actor.share_prompt_forward, actor.shuffle)


def local_worker_groups(config: RLVRConfig, steps: int, tokenizer, tool_setup, run_dir: Path):
    """The workers in this process (one device)."""
    worker = ActorRolloutRefWorker(config, steps, tokenizer, tool_setup)
    worker.init_model()
    critic_wg = None
    if config.algorithm.adv_estimator == "gae":  # PPO: the only estimator that needs learned values
        critic = CriticWorker(*critic_args(config, steps, tokenizer.pad_token_id))
        critic.init_model()
        critic_wg = LocalWorkerGroup(critic)
    rollout_wg = None
    # an engine with its own weights, generating ahead, or the driver of rollout servers (drives_servers)
    if config.trainer.v1.trainer_mode == "colocate_async" or drives_servers(config):
        rollout_wg = local_rollout_group(config, tokenizer, tool_setup)
    return LocalWorkerGroup(worker), critic_wg, rollout_wg


def local_rollout_group(config: RLVRConfig, tokenizer, tool_setup) -> LocalWorkerGroup:
    """A ``RolloutWorker`` in this process: an engine with weights of its own, or the servers' driver."""
    rollout = RolloutWorker(config, tokenizer, tool_setup)
    rollout.init_model()
    return LocalWorkerGroup(rollout)


def ray_worker_groups(config: RLVRConfig, steps: int, tokenizer, tool_setup, run_dir: Path):
    """One Ray actor per device holding actor-rollout-ref (and the critic): ranks of one group."""
    from rlvr.distributed.ray_workers import (RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager, Role,
                                              create_colocated_worker_cls)

    trainer = config.trainer
    use_gpu = ray_uses_gpu(config)
    pools = {"global_pool": [trainer.n_gpus_per_node] * trainer.nnodes}
    hybrid = config.actor_rollout_ref.hybrid_engine
    servers = drives_servers(config)  # the rollout is the servers, driven from this process
    pool = not hybrid and not servers
    if pool:  # the rollout on devices of its own
        pools["rollout_pool"] = [config.actor_rollout_ref.rollout.n_gpus_per_node]
    manager = ResourcePoolManager(pools, {Role.ActorRollout: "global_pool", Role.Critic: "global_pool",
                                          Role.Rollout: "rollout_pool"}, use_gpu)
    manager.create_resource_pools()
    # the workers load the tokenizer and tools themselves: those objects stay in this process
    classes = {Role.ActorRollout.value: RayClassWithInitArgs(ActorRolloutRefWorker, config, steps)}
    if config.algorithm.adv_estimator == "gae":
        classes[Role.Critic.value] = RayClassWithInitArgs(CriticWorker, *critic_args(config, steps,
                                                                                     tokenizer.pad_token_id))
    group = RayWorkerGroup(manager.get_resource_pool(Role.ActorRollout), create_colocated_worker_cls(classes),
                           run_dir, local_cluster=config.ray_kwargs.ray_init.address is None)
    groups = group.spawn(classes)
    if pool:
        rollout_cls = create_colocated_worker_cls({Role.Rollout.value: RayClassWithInitArgs(RolloutWorker, config)})
        groups.update(RayWorkerGroup(manager.get_resource_pool(Role.Rollout), rollout_cls, run_dir / "rollout_pool",
                                     local_cluster=config.ray_kwargs.ray_init.address is None).spawn([Role.Rollout.value]))
    for wg in groups.values():
        wg.init_model()
    if pool:  # the weights reach the pool by broadcast from the actor's rank 0
        engine = config.actor_rollout_ref.rollout.checkpoint_engine
        backend = engine.backend if engine.backend != "naive" else "nccl" if on_gpu(config) else "gloo"
        open_channel(groups[Role.ActorRollout.value], groups[Role.Rollout.value], backend,
                     engine.update_weights_bucket_megabytes)
        groups[Role.Rollout.value].weight_channel_open = True
    # with servers, rank 0 gathers each version and this process's driver sends it on to them
    rollout_wg = local_rollout_group(config, tokenizer, tool_setup) if servers else groups.get(Role.Rollout.value)
    return groups[Role.ActorRollout.value], groups.get(Role.Critic.value), rollout_wg


def build_trainer(config: RLVRConfig, progress_bar: bool = True) -> RLTrainer:
    ensure_default_data(config)
    run_dir = Path(config.trainer.default_local_dir).expanduser()
    model_cfg = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
    tool_setup = ToolSetup.from_config(tokenizer, config.actor_rollout_ref.rollout, config.data.apply_chat_template_kwargs)
    chat = tool_setup.chat if tool_setup is not None else None
    train = RLHFDataset(config.data.train_files, tokenizer, config.data, chat)
    val = RLHFDataset(config.data.val_files, tokenizer, config.data, chat) if config.data.val_files else None
    check_scorable(train, config.reward, config.data.reward_fn_key, "data.train_files")
    if val is not None:
        check_scorable(val, validation_reward_config(config.reward), config.data.reward_fn_key, "data.val_files")
    for dataset, split in ((train, "data.train_files"), (val, "data.val_files")):
        if dataset is not None:
            check_agent_names(dataset.rows, dataset.origins, config, split)
    for dataset, split in ((train, "data.train_files"), (val, "data.val_files")):
        if dataset is not None:
            dataset.say_filtered(split)
    if tool_setup is not None:
        interactions = interaction_names(config.actor_rollout_ref.rollout.multi_turn.interaction_config_path)
        for dataset, split in ((train, "data.train_files"), (val, "data.val_files")):
            check_tools_kwargs(dataset, tool_setup.tools, split)
            check_interaction_names(dataset, interactions, split)
    per_batch = config.data.gen_batch_size or config.data.train_batch_size
    batches = len(train) // per_batch
    if batches == 0:
        raise ConfigError(f"data.train_batch_size (or gen_batch_size) = {per_batch} is larger than the training set "
                          f"({len(train)} rows after filtering); lower it or add rows")
    steps = total_steps(config, batches)
    resume_from = checkpoint.resolve_resume(config)  # a damaged checkpoint is refused before the model loads
    if resume_from is not None:  # and so is an incompatible one, before the folder's record is written
        checkpoint.load_trainer_state(resume_from, config, sampler={"num_rows": len(train), "batch_size": per_batch})
    actor_wg, critic_wg, rollout_wg = (ray_worker_groups if uses_ray(config) else local_worker_groups)(
        config, steps, tokenizer, tool_setup, run_dir)
    reward_fn = RewardManager(tokenizer, config.reward, config.data.reward_fn_key, config.data.max_response_length)
    val_reward_fn = RewardManager(tokenizer, validation_reward_config(config.reward), config.data.reward_fn_key)
    reward_model = None
    if config.reward.reward_model.enable:
        from rlvr.rewards.reward_model import RewardModel

        reward_model = RewardModel(config.reward.reward_model, tokenizer, str(resolve_device(config.trainer.device)))
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint.replace_text(run_dir / "config.yaml", to_yaml(config))  # a resume rewrites it: never half of it
    tracker = Tracking(config.trainer.logger, run_dir, progress_bar, config.trainer.project_name,
                       config.trainer.experiment_name, dataclasses.asdict(config))
    trainer = RLTrainer(config, actor_wg, tokenizer, train, val, reward_fn,
                        val_reward_fn if val is not None else None, steps, tracker, critic_wg, reward_model,
                        rollout_wg)
    if resume_from is not None:
        trainer.load_checkpoint(resume_from)
        print(f"[rlvr] resumed from {resume_from} (step {trainer.global_step} of {steps})", flush=True)
    return trainer


RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints/", "rollouts/", "tensorboard/", "wandb/")


def written(run_dir: Path) -> list[str]:
    """What the run's last line names: the run directory's usual entries that exist (metrics.jsonl
    only with the jsonl logger, checkpoints/ only once one is saved)."""
    return [name for name in RUN_FILES if (run_dir / name).exists()]


def fit(config: RLVRConfig, progress_bar: bool = True, stop_requested=None) -> dict[str, float]:
    """Build the trainer and run it to the end (in this process, or in the TaskRunner actor)."""
    run_dir = Path(config.trainer.default_local_dir).expanduser().resolve()
    trainer = build_trainer(config, progress_bar)
    if stop_requested is not None:
        trainer.stop_requested = stop_requested
    if trainer.global_step >= trainer.total_training_steps:
        print(f"[rlvr] this run is already complete ({trainer.global_step} steps); set trainer.resume_mode=disable "
              "or another trainer.experiment_name to train again", flush=True)
    try:
        return trainer.fit()
    except StopTraining as err:
        if uses_ray(config):  # a worker failed: say where to resume from
            last = checkpoint.latest_checkpoint(checkpoint.checkpoint_root(config))
            raise type(err)(f"{err}\n{resume_hint(last)}") from None
        raise
    finally:
        trainer.tracker.close()
        trainer.reward_fn.close()
        if trainer.val_reward_fn is not None:
            trainer.val_reward_fn.close()
        release_worker_groups(trainer.wg, trainer.critic_wg, trainer.rollout_wg)
        print(f"[rlvr] run directory: {run_dir} ({', '.join(written(run_dir)) or 'nothing written yet'})", flush=True)


def release_worker_groups(*groups) -> None:
    """End each Ray worker group once (its views share the actors and the pool): Ray keeps a group's
    placement groups after the run, so a second run in a Ray that stays up (a notebook's) could not
    place its workers. In-process groups have nothing to release."""
    released = set()
    for group in groups:
        pool = getattr(group, "resource_pool", None)
        if pool is not None and hasattr(group, "kill") and id(pool) not in released:
            released.add(id(pool))
            group.kill()


def resume_hint(last: Path | None) -> str:
    """What running the same command again does: resume from ``last``, or (no checkpoint) start over."""
    if last is None:
        return "no checkpoint yet, so running the same command again starts from the beginning"
    return f"last checkpoint: {last}; run the same command again to resume from it"


class TaskRunner:
    """The single controller as a Ray actor: runs ``fit`` next to the worker group it drives. The
    driver's Ctrl-C cancels the task, which the fit loop sees after the current step: it saves
    that step and stops, as Ctrl-C does in one process."""

    def run(self, config: RLVRConfig) -> dict[str, float]:
        import ray

        import_custom_modules(config.custom_modules)  # the estimators and reward functions it registers
        return fit(config, progress_bar=False, stop_requested=ray.get_runtime_context().is_canceled)

    def finished(self) -> bool:
        return True


def fit_on_ray(config: RLVRConfig) -> dict[str, float]:
    import ray

    from rlvr.distributed.ray_workers import init_ray

    run_dir = Path(config.trainer.default_local_dir).expanduser().resolve()
    ray_init = config.ray_kwargs.ray_init
    session = init_ray(ray_init.address, ray_init.num_cpus, run_dir, ray_init.runtime_env, ray_init.kwargs)
    rollout = "" if config.actor_rollout_ref.hybrid_engine else \
        f" + {config.actor_rollout_ref.rollout.n_gpus_per_node} rollout workers"
    logs = run_dir / "ray" / "session_latest" / "logs" if ray_init.address is None else "on the cluster"
    print(f"[rlvr] Ray: {config.trainer.n_gpus_per_node * config.trainer.nnodes} workers{rollout}; Ray's logs: {logs}",
          flush=True)
    try:
        runner = ray.remote(num_cpus=0)(TaskRunner).remote()
        task = runner.run.remote(config)
        try:
            return ray.get(task)
        except KeyboardInterrupt:
            print("[rlvr] Ctrl-C: the run stops after the current step and saves it (Ctrl-C again: stop now, "
                  "keeping the last checkpoint)", flush=True)
            ray.cancel(task, recursive=False)  # a flag the fit loop reads after its step; then it saves and returns
            ray.get(runner.finished.remote())  # an actor runs one task at a time: this one starts after ``run``
            last = checkpoint.latest_checkpoint(checkpoint.checkpoint_root(config))
            raise TrainingInterrupted(f"interrupted; {resume_hint(last)}") from None
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, Exception):
            raise err.cause from None
        raise
    finally:
        if session is not None:
            session.shutdown()  # the local Ray's logs kept in the run folder, its /tmp folder removed


def no_validation_notice(config: RLVRConfig) -> str | None:
    """What an empty ``data.val_files`` turns off, when the config asks for validation (the GRPO
    recipe's test_freq and val_before_train do): said before the run, not skipped in silence."""
    trainer = config.trainer
    asked = [f"trainer.test_freq={trainer.test_freq}" if trainer.test_freq > 0 else None,
             "trainer.val_before_train=true" if trainer.val_before_train else None]
    asked = [item for item in asked if item]
    if config.data.val_files or not asked:
        return None
    return (f"[rlvr] note: data.val_files is empty: this run validates never, so {' and '.join(asked)} "
            f"{'have' if len(asked) > 1 else 'has'} no effect (set data.val_files to validate, or trainer.test_freq=-1 "
            "and trainer.val_before_train=false to say no validation)")


def run_training(config: RLVRConfig) -> dict[str, float]:
    notice = no_validation_notice(config)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    config = claim_run_folder(config)  # one run per folder: this one's, before anything is written
    run_dir = Path(config.trainer.default_local_dir).expanduser().resolve()
    # absolute from here: a Ray actor (runtime_env.working_dir) runs in another folder than this process
    config = moved(config, config.trainer.default_local_dir, str(run_dir))
    with lock_run_folder(run_dir, config):  # and one process per folder, for as long as it runs
        print(f"[rlvr] run directory: {run_dir}", flush=True)
        return fit_on_ray(config) if uses_ray(config) else fit(config)
