"""Build a training run from a config and run it: ``rlvr train`` calls ``run_training``.

Everything a run needs is built here, in the order a failure is cheapest to report: the
run directory, the tokenizer (a missing model path fails before any weights load), the
datasets (every row must have a scorable data_source), the workers, the reward managers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlvr.config import ConfigError, to_yaml
from rlvr.config.schema import CustomRewardFunctionConfig, DataConfig, OverlongBufferConfig, RewardConfig, RLVRConfig
from rlvr.data import RLHFDataset
from rlvr.data.io import DatasetError
from rlvr.distributed import LocalWorkerGroup
from rlvr.models import load_tokenizer
from rlvr.rewards import RewardManager
from rlvr.rollout import ToolSetup
from rlvr.rewards.registry import needs_ground_truth, reward_fn_name_for
from rlvr.trainer import checkpoint
from rlvr.trainer.ppo_trainer import RLTrainer
from rlvr.trainer.tracking import Tracking
from rlvr.workers.critic import CriticWorker
from rlvr.workers.hybrid import ActorRolloutRefWorker

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


def check_scorable(dataset: RLHFDataset, config: RLVRConfig, split: str) -> None:
    """Every row must be scorable: its data_source selects a reward function (unless functions
    are configured), and a function that compares against ``reward_model.ground_truth`` finds one.
    Otherwise every sample of that row would fail to score, at every step."""
    reward = config.reward
    if reward.custom_reward_function.path:
        return  # a user's function: rlvr cannot know what it reads
    key = config.data.reward_fn_key
    fixed = [f.name for f in reward.functions] or None
    for row, origin in zip(dataset.rows, dataset.origins):
        source = row.get(key)
        try:
            names = fixed or [reward_fn_name_for(source)]
        except KeyError as err:
            raise DatasetError(f"{origin} ({split}): {err.args[0]}") from None
        truth = (row.get("reward_model") or {}).get("ground_truth")
        needing = [name for name in names if needs_ground_truth(name)]
        if truth is None and needing:
            raise DatasetError(
                f"{origin} ({split}): key 'reward_model.ground_truth' is missing, but the reward function "
                f"{needing[0]!r} (for data_source {source!r}) compares each response against it; add "
                "\"reward_model\": {\"ground_truth\": ...} to every row (rlvr prepare writes it), or score with your "
                "own function (reward.custom_reward_function.path)")


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
    if config.trainer.total_training_steps is not None:
        return config.trainer.total_training_steps
    return batches_per_epoch * config.trainer.total_epochs


def build_trainer(config: RLVRConfig, progress_bar: bool = True) -> RLTrainer:
    ensure_default_data(config)
    run_dir = Path(config.trainer.default_local_dir).expanduser()
    model_cfg = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
    tool_setup = ToolSetup.from_config(tokenizer, config.actor_rollout_ref.rollout)
    chat = tool_setup.chat if tool_setup is not None else None
    train = RLHFDataset(config.data.train_files, tokenizer, config.data, chat)
    val = RLHFDataset(config.data.val_files, tokenizer, config.data, chat) if config.data.val_files else None
    check_scorable(train, config, "data.train_files")
    if val is not None:
        check_scorable(val, config, "data.val_files")
    if tool_setup is not None:
        for dataset, split in ((train, "data.train_files"), (val, "data.val_files")):
            check_tools_kwargs(dataset, tool_setup.tools, split)
    per_batch = config.data.gen_batch_size or config.data.train_batch_size
    batches = len(train) // per_batch
    if batches == 0:
        raise ConfigError(f"data.train_batch_size (or gen_batch_size) = {per_batch} is larger than the training set "
                          f"({len(train)} rows after filtering); lower it or add rows")
    steps = total_steps(config, batches)
    worker = ActorRolloutRefWorker(config, steps, tokenizer, tool_setup)
    worker.init_model()
    critic_wg = None
    if config.algorithm.adv_estimator == "gae":  # PPO: the only estimator that needs learned values
        critic = CriticWorker(config.critic, steps, tokenizer.pad_token_id, config.trainer.device, config.trainer.seed,
                              config.actor_rollout_ref.actor.loss_agg_mode)
        critic.init_model()
        critic_wg = LocalWorkerGroup(critic)
    reward_fn = RewardManager(tokenizer, config.reward, config.data.reward_fn_key, config.data.max_response_length)
    val_reward_fn = RewardManager(tokenizer, validation_reward_config(config.reward), config.data.reward_fn_key)
    reward_model = None
    if config.reward.reward_model.enable:
        from rlvr.rewards.reward_model import RewardModel

        reward_model = RewardModel(config.reward.reward_model, tokenizer, str(worker.device))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(config))
    tracker = Tracking(config.trainer.logger, run_dir, progress_bar, config.trainer.project_name,
                       config.trainer.experiment_name, dataclasses.asdict(config))
    trainer = RLTrainer(config, LocalWorkerGroup(worker), tokenizer, train, val, reward_fn,
                        val_reward_fn if val is not None else None, steps, tracker, critic_wg, reward_model)
    resume_from = checkpoint.resolve_resume(config)
    if resume_from is not None:
        trainer.load_checkpoint(resume_from)
        print(f"[rlvr] resumed from {resume_from} (step {trainer.global_step} of {steps})", flush=True)
    return trainer


def run_training(config: RLVRConfig) -> dict[str, float]:
    run_dir = Path(config.trainer.default_local_dir).expanduser().resolve()
    print(f"[rlvr] run directory: {run_dir}", flush=True)
    trainer = build_trainer(config)
    if trainer.global_step >= trainer.total_training_steps:
        print(f"[rlvr] this run is already complete ({trainer.global_step} steps); set trainer.resume_mode=disable "
              "or another trainer.experiment_name to train again", flush=True)
    try:
        return trainer.fit()
    finally:
        trainer.tracker.close()
        trainer.reward_fn.close()
        if trainer.val_reward_fn is not None:
            trainer.val_reward_fn.close()
        print(f"[rlvr] run directory: {run_dir} (config.yaml, metrics.jsonl)", flush=True)
