"""The fit loop: one GRPO (or PPO-family) step after another, in the seeds' order.

``RLTrainer.train_step`` reads like the algorithm: prompts get a group id, are repeated n
times and sampled; the samples are scored; the actor's and the reference's log-probs are
computed; rewards (minus a KL penalty when ``use_kl_in_reward``) become advantages; the
actor is updated. Each stage is one call into the folder that owns it. The trainer owns
the order and the cheap computations (advantages, metrics); workers, reached through a
worker group, own the models.

With DAPO's dynamic sampling (``algorithm.filter_groups``) the rollout-and-score stage
repeats over further prompt batches until enough groups carry signal. A step is complete
when its updates return (``_commit``); see ``fit`` for what Ctrl-C saves.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from tqdm import tqdm

from rlvr.algos.advantages import compute_advantage
from rlvr.algos.dapo import filter_groups
from rlvr.algos.kl import apply_kl_penalty, get_kl_controller
from rlvr.algos.rollout_correction import is_active, rollout_correction
from rlvr.algos.utils import in_groups, uid_list
from rlvr.config.schema import RLVRConfig
from rlvr.config.validate import ConfigError
from rlvr.data.sampler import PromptLoader
from rlvr.protocol import DataProto, concat_rollouts, episode_rows, expand_to_samples, final_samples, loss_mask
from rlvr.rewards.manager import TRAJECTORY_KEYS, place_on_last_token
from rlvr.rewards.reward_model import add_reward_model_scores
from rlvr.errors import RolloutUnavailable, StopTraining, TrainingInterrupted
from rlvr.trainer import checkpoint
from rlvr.trainer.evaluate import evaluate, generation_batch
from rlvr.trainer.guards import (GAP_TEMPERATURE, PROBE_TOKENS, EngineParity, check_groups, check_masks,
                                 freshness_tolerance)
from rlvr.trainer.metrics import (compute_data_metrics, compute_off_policy_metrics, compute_throughput_metrics,
                                  compute_timing_metrics, reduce_metrics, timer)
from rlvr.trainer.progress import StepProgress
from rlvr.trainer.rollout_ahead import BroadcastWeights, CopyWeights, Dispatched, RolloutAhead
from rlvr.trainer.tracking import Tracking
from rlvr.workers.teacher import screen_teacher_log_probs


AHEAD_FILE = "rollouts_ahead.pt"  # async: the batches generated ahead of the checkpoint's step


class DynamicSamplingError(StopTraining):
    """DAPO dynamic sampling could not collect train_batch_size informative groups."""


def needs_old_log_prob_pass(config: RLVRConfig) -> bool:
    """Whether old_log_probs need their own forward pass (see ``actor.recompute_old_log_prob``)."""
    actor, algo = config.actor_rollout_ref.actor, config.algorithm
    if algo.rollout_correction.bypass_mode:  # pi_old is the rollout's log-probs
        return False
    one_update = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size == config.data.train_batch_size
    read_before_update = algo.use_kl_in_reward or is_active(algo.rollout_correction)
    return actor.recompute_old_log_prob or not one_update or read_before_update


def share_episode_scores(reward, rows: np.ndarray, response_mask: torch.Tensor):
    """A ``RewardResult`` of one row per episode as one of every sample (``rows``: each sample's
    episode), each score on its own sample's last token."""
    index = torch.as_tensor(rows)
    picked = reward.select(rows)
    picked.token_level_scores = place_on_last_token(reward.token_level_scores.sum(-1)[index], response_mask)
    return picked


def narrow_train_mask(batch: DataProto, keep: torch.Tensor) -> None:
    """Tokens where ``keep`` is 0 carry no loss: ``train_mask`` (``response_mask`` until a first
    narrowing) times ``keep``; the actor and the critic read it (``protocol.loss_mask``)."""
    batch.batch["train_mask"] = loss_mask(batch) * keep


class RLTrainer:
    """Drives training: data, rollout, rewards, advantages, updates, validation, metrics."""

    def __init__(self, config: RLVRConfig, worker_group, tokenizer, train_dataset, val_dataset, reward_fn,
                 val_reward_fn, total_training_steps: int, tracker: Tracking | None = None, critic_wg=None,
                 reward_model=None, rollout_wg=None):
        self.config = config
        self.wg = worker_group
        self.rollout_wg = rollout_wg or worker_group  # rollout workers of their own (hybrid_engine=false), or the actor's
        self.critic_wg = critic_wg
        self.reward_model = reward_model
        self.tokenizer = tokenizer
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        self.total_training_steps = total_training_steps
        self.tracker = tracker or Tracking([], None)
        data = config.data
        self.loader = PromptLoader(train_dataset, data.gen_batch_size or data.train_batch_size, data.shuffle, data.seed)
        self.global_step = 0
        self.use_reference = config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward
        self.kl_ctrl = get_kl_controller(config.algorithm.kl_ctrl)
        self.separate_old_log_prob = needs_old_log_prob_pass(config)
        self.parity = EngineParity(config)  # the engine's log-probs against the actor's, step 1 on
        self._completed = self._snapshot(0)
        self._pending: dict | None = None  # the completed step's record until it is logged
        self._updating = False  # inside a step's updates: the weights are partly updated
        self._saved_step = 0
        # async (trainer.v1.trainer_mode colocate_async | separate_async): the engine generates ahead
        ahead = config.trainer.v1.colocate_async.num_warmup_batches
        # how a weight version reaches rollout workers of their own: broadcast to a Ray pool, or copied
        broadcast = getattr(self.rollout_wg, "weight_channel_open", False)
        servers = config.actor_rollout_ref.rollout.mode == "async"
        self.weights = BroadcastWeights(self.wg, self.rollout_wg) if broadcast else \
            CopyWeights(self.wg, self.rollout_wg, to_cpu=servers)
        self.ahead = RolloutAhead(self.rollout_wg, ahead, self.weights) if config.trainer.v1.trainer_mode != "sync" else None
        self._prompt_batches = None  # async: the prompt stream the dispatches draw from
        self.progress = StepProgress()  # the phase of the step under way (fit gives it the bar)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train for ``total_training_steps``; returns the last step's metrics (with validation).

        A step is complete as soon as its updates return: the sampler position, KL coefficient
        and RNG are recorded then (``_commit``), and what follows (validation, checkpoint, logging)
        only reads the weights. Ctrl-C outside an update saves that complete step, with its
        record if it was not logged yet, and raises ``TrainingInterrupted``; Ctrl-C inside an
        update keeps the last checkpoint (the weights are then neither step's).
        """
        last: dict[str, float] = {}
        progress = None
        try:
            if self._pending is not None:  # resumed from a step whose record was not logged
                last = self._finish_step(None)
            if self.val_reward_fn is not None and self.config.trainer.val_before_train and self.global_step == 0:
                last = self.validate()
                self.tracker.log(last, step=0)
            progress = tqdm(total=self.total_training_steps, initial=self.global_step, desc="training", unit="step",
                            dynamic_ncols=True, disable=not self.tracker.progress_bar)
            self.progress = StepProgress(progress)
            last = self._loop(progress) or last
        except KeyboardInterrupt:
            if progress is not None:
                progress.close()
            try:
                message = self._save_on_interrupt()
            except KeyboardInterrupt:  # Ctrl-C again while saving: stop now, that save discarded
                kept = (f"the last checkpoint is step {self._saved_step}; {self._how_to_resume()}"
                        if self._saved_step else
                        "no checkpoint exists yet, so running the same command again starts from the beginning")
                message = (f"interrupted again while saving step {self._completed['global_step']}: that save was "
                           f"discarded; {kept}")
            raise TrainingInterrupted(message) from None
        except RolloutUnavailable as err:  # nothing left to generate on: keep what is complete, say why
            if progress is not None:
                progress.close()
            raise RolloutUnavailable(f"{err}\n{self._save_on_interrupt()}") from None
        finally:
            self.progress.close()
            if self.ahead is not None:
                self.ahead.close()
            if self.config.actor_rollout_ref.rollout.mode == "async":  # the servers stop with the run, by the
                self.rollout_wg.shutdown()  # worker in this process that drives them (never a Ray group's)
        progress.close()
        return last

    def _loop(self, progress) -> dict[str, float]:
        last: dict[str, float] = {}
        batches = self._batches()
        more_batches = (batch for batch, _ in batches)  # the same stream, for dynamic sampling
        self._prompt_batches = batches
        while self.global_step < self.total_training_steps:
            self.progress.start_step(self.global_step + 1)
            if self.ahead is None:
                batch, epoch = next(batches)
                self.global_step += 1
                metrics = self.train_step(batch, more_batches)
            else:  # the engine draws the prompts, ahead: the step trains on what it generated
                self.global_step += 1
                metrics = self.train_step(None)
                epoch = self.ahead.take(self.global_step).epoch  # generated already: queued until the commit
            metrics["training/epoch"] = float(epoch)
            self._commit(metrics)
            last = self._finish_step(progress)
            self.progress.end_step()
            if self.stop_requested():  # a Ctrl-C that reached the controller as a request: stop here
                raise KeyboardInterrupt
        return last

    def stop_requested(self) -> bool:
        """Whether to stop after this step as if Ctrl-C had come (set by the Ray TaskRunner, where
        the driver's Ctrl-C arrives as a cancellation request, not as a signal)."""
        return False

    def _batches(self) -> Iterator[tuple[DataProto, int]]:
        """(prompt batch, its epoch), epoch after epoch, from where the sampler stands."""
        while True:
            epoch = self.loader.sampler.epoch
            for batch in self.loader:
                yield batch, epoch

    def _snapshot(self, step: int) -> dict[str, Any]:
        """What a checkpoint of ``step`` holds besides the workers' state."""
        return {"global_step": step, "sampler": self.loader.state_dict(), "kl_ctrl": self.kl_ctrl.value,
                "rng": checkpoint.rng_state(), "engine_parity": dict(self.parity.baselines)}

    def _commit(self, metrics: dict[str, float]) -> None:
        """The step's updates returned: it is complete; its record waits to be logged."""
        self._completed = self._snapshot(self.global_step)
        if self.ahead is not None:
            self.ahead.forget(self.global_step)
        self._pending = {"metrics": metrics, "validated": False}
        self._updating = False

    def _finish_step(self, progress) -> dict[str, float]:
        """Validation (every ``test_freq`` steps and at the last), checkpoint (every ``save_freq``
        steps and at the last; -1 never, as in verl), then the step's record is logged."""
        trainer, step = self.config.trainer, self._completed["global_step"]
        final = step >= self.total_training_steps
        metrics = self._pending["metrics"]
        if (not self._pending["validated"] and self.val_reward_fn is not None and trainer.test_freq > 0
                and (final or step % trainer.test_freq == 0)):
            timings: dict[str, float] = {}
            with self.progress.stage("testing", timings):
                metrics.update(self.validate())
            metrics["timing_s/testing"] = timings["testing"]
        self._pending["validated"] = True
        if trainer.save_freq > 0 and (final or step % trainer.save_freq == 0) and self._saved_step != step:
            self.save_checkpoint()
        self.tracker.log(metrics, step=step)
        self._pending = None
        if progress is not None:
            progress.update(1)
            progress.set_postfix(reward=f"{metrics['critic/score/mean']:.3f}", step_s=f"{metrics['timing_s/step']:.1f}")
        return metrics

    def _how_to_resume(self) -> str:
        """The same command resumes under resume_mode=auto; another mode starts afresh in a folder of
        its own (or from the path again), so it is named."""
        if self.config.trainer.resume_mode == "auto":
            return "run the same command again to resume (trainer.resume_mode=auto)"
        return (f"to resume, run again with trainer.resume_mode=auto "
                f"trainer.default_local_dir={self.config.trainer.default_local_dir} (this run has "
                f"trainer.resume_mode={self.config.trainer.resume_mode}, which does not resume it)")

    def _save_on_interrupt(self) -> str:
        """Save the last complete step (unless saved already); the message for the user."""
        step = self._completed["global_step"]
        resume = self._how_to_resume()
        if self._updating:
            kept = (f"the last checkpoint, step {self._saved_step}, is kept; {resume}" if self._saved_step
                    else "no checkpoint exists yet, so running the same command again starts from the beginning")
            return (f"interrupted inside step {self.global_step}'s update: the weights are partly updated and belong "
                    f"to no step, so nothing was saved; {kept}")
        if step == 0:
            return "interrupted before the first step finished; nothing to save"
        where = f"step {step} was already saved" if step == self._saved_step else f"saved step {step} to {self.save_checkpoint()}"
        return f"interrupted after step {step}; {where}; {resume}"

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """The last complete step: worker states, and the snapshot taken when its updates
        returned (sampler, KL controller, RNG), with its record if not logged yet."""
        step = self._completed["global_step"]
        self.progress.phase("saving")
        state = {**self._completed, "pending": self._pending, "compatibility": checkpoint.compatibility(self.config)}

        def write_parts(folder: Path) -> None:
            self.wg.save_checkpoint(folder)
            if self.critic_wg is not None:
                self.critic_wg.save_checkpoint(folder)
            if self.ahead is not None:  # the batches generated ahead: a resume trains on these very ones
                torch.save(self.ahead.drain(step + self.ahead.ahead), folder / AHEAD_FILE)

        root, keep = checkpoint.checkpoint_root(self.config), self.config.trainer.max_actor_ckpt_to_keep
        try:
            path = checkpoint.save(root, step, write_parts, state, keep)
        except checkpoint.CheckpointWriteError:  # a full disk: the record the checkpoint would carry is logged now
            if self._pending is not None:
                self.tracker.log(self._pending["metrics"], step=step)
                self._pending = None
            raise
        self._saved_step = step
        tqdm.write(checkpoint.describe_saved(root, path, keep))
        if self.ahead is not None:  # a batch generated ahead failed: reported now that its step is saved
            self.ahead.check_failed(step + self.ahead.ahead, f"step {step} was saved to {path}")
        return path

    def sync_rollout_weights(self) -> None:
        """Rollout workers of their own get the actor's new weights (the hybrid engine needs nothing:
        it generates with the actor's own weights)."""
        if self.rollout_wg is self.wg:
            return
        self.weights.send(self.global_step)()

    def load_checkpoint(self, path: Path) -> None:
        """Continue from ``path`` exactly where the saved run stopped."""
        state = checkpoint.load_trainer_state(path, self.config)
        self.wg.load_checkpoint(path)
        if self.ahead is not None:  # the next dispatch loads the weights it needs
            if not (path / AHEAD_FILE).is_file():
                raise ConfigError(f"cannot resume from {path} with trainer.v1.trainer_mode="
                                  f"{self.config.trainer.v1.trainer_mode}: it was saved by a synchronous run (it holds "
                                  f"no {AHEAD_FILE}); resume it with trainer.v1.trainer_mode=sync")
            self.ahead.restore(torch.load(path / AHEAD_FILE, weights_only=False), state["global_step"])
        if self.critic_wg is not None:
            self.critic_wg.load_checkpoint(path)
        self.loader.load_state_dict(state["sampler"])
        self.global_step = self._saved_step = state["global_step"]
        if self.ahead is None:  # a pool of its own gets the checkpoint's weights as the version they are
            self.sync_rollout_weights()
        self.kl_ctrl.value = state["kl_ctrl"]
        checkpoint.set_rng_state(state["rng"])
        self.parity.baselines = dict(state.get("engine_parity", {}))  # step 1's noise: the drift's reference
        self._completed = {key: state[key] for key in ("global_step", "sampler", "kl_ctrl", "rng")}
        self._completed["engine_parity"] = dict(self.parity.baselines)
        self._pending = state.get("pending")
        # records after the checkpoint are logged again; an unlogged step's own record too
        self.tracker.rewind(self.global_step - 1 if self._pending is not None else self.global_step)

    def train_step(self, batch: DataProto | None, more_batches: Iterator[DataProto] = iter(())) -> dict[str, float]:
        """One step on one batch of prompts (and, under DAPO dynamic sampling, as many more from
        ``more_batches`` as it takes; async: None, the batch the engine generated ahead); returns
        its metrics."""
        cfg = self.config
        metrics: dict[str, float] = {"training/global_step": float(self.global_step)}
        timings: dict[str, float] = {}
        with timer("step", timings):
            if self._freshness_due():
                with self.progress.stage("freshness_probe", timings):
                    metrics.update(self._check_freshness())
            if cfg.algorithm.filter_groups.enable:
                batch = self._dynamic_sampling(batch, more_batches, metrics, timings)
                reward = None  # scored and filtered already
            elif self.ahead is not None:
                batch, reward = self._rollout_ahead(timings)
            else:
                batch, reward = self._rollout(batch, 0, timings)
            if self.separate_old_log_prob:
                with self.progress.stage("old_log_prob", timings):
                    batch = batch.union(self.wg.compute_log_prob(batch))
            metrics.update(self._correct_rollout(batch))
            if self.use_reference:
                with self.progress.stage("ref", timings):
                    batch = batch.union(self.wg.compute_ref_log_prob(batch))
            if self.config.distillation.enabled:
                with self.progress.stage("teacher", timings):
                    batch = batch.union(self.wg.compute_teacher_log_prob(batch))
                    metrics.update(self._screen_teacher(batch))
            if self.critic_wg is not None:
                with self.progress.stage("values", timings):
                    batch = batch.union(self.critic_wg.compute_values(batch))
            with self.progress.stage("adv", timings):
                if reward is not None:
                    metrics.update(self._attach_scores(batch, reward))
                metrics.update(self._advantages(batch))
            if cfg.trainer.rollout_data_dir:  # before the updates: an interrupt here leaves the weights alone
                with self.progress.stage("dump_rollout", timings):
                    self._dump_rollouts(batch, Path(cfg.trainer.rollout_data_dir).expanduser())
            self._updating = True  # until _commit: an interrupt now finds the weights partly updated
            if self.critic_wg is not None:
                with self.progress.stage("update_critic", timings):
                    metrics.update(reduce_metrics(self.critic_wg.update_critic(batch).meta_info["metrics"]))
            with self.progress.stage("update_actor", timings):
                update = self.wg.update_actor(batch)
            if self.rollout_wg is not self.wg and self.ahead is None:
                with self.progress.stage("sync_weights", timings):  # to the rollout workers of their own
                    self.sync_rollout_weights()
            metrics.update(reduce_metrics(update.meta_info["metrics"]))
            if not self.separate_old_log_prob:  # taken from the update's own forward: assigned, not
                # unioned, since the in-process worker fills the batch's own tensor and a diverged
                # policy's NaN log-probs never compare equal to themselves
                if "old_log_probs" in update.batch.keys():  # not in bypass mode: pi_old is the rollout's
                    batch.batch["old_log_probs"] = update.batch["old_log_probs"]
            metrics.update(self._check_engine_parity(batch))
        metrics.update(compute_data_metrics(batch, cfg.data.max_response_length, cfg.data.max_prompt_length))
        metrics.update(compute_timing_metrics(batch, timings))
        metrics.update(compute_throughput_metrics(batch, timings["step"], cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes))
        metrics.update(compute_off_policy_metrics(batch, self.global_step, timings))
        return metrics

    def _seed(self, purpose: str, gen_index: int = 0, step: int | None = None) -> int:
        """A distinct, reproducible sampling seed per step (this one unless ``step``), purpose and
        generation batch."""
        offset = {"train": 0, "greedy": 1, "val": 2}[purpose]
        step = self.global_step if step is None else step
        return (self.config.actor_rollout_ref.rollout.seed * 1_000_003 + step) * 3 + offset + gen_index * 104_729 * 3

    # ------------------------------------------------------------------ stages
    def _rollout(self, batch: DataProto, gen_index: int, timings: dict[str, float]):
        """n responses per prompt, scored (or being scored): (the batch, the reward or its future)."""
        batch, gen_batch = self._dispatch(batch, self.global_step, gen_index)
        with self.progress.stage("gen", timings):
            gen_out = self.rollout_wg.generate_sequences(gen_batch)
        if "policy_version" not in gen_out.non_tensor_batch:  # the hybrid engine: the actor's own weights
            gen_out.non_tensor_batch["policy_version"] = np.full(len(gen_out), self.global_step - 1, dtype=np.int64)
        self._check_version(gen_out.non_tensor_batch["policy_version"], self.global_step)
        return self._score(expand_to_samples(batch, gen_out).union(gen_out), gen_index, timings, gen_batch)

    def _dispatch(self, batch: DataProto, step: int, gen_index: int) -> tuple[DataProto, DataProto]:
        """Step ``step``'s prompts with their group ids, repeated n times: (the batch, what the
        engine is sent). ``dispatch_step`` is the step under way when they are sent (async: an
        earlier one)."""
        n = self.config.actor_rollout_ref.rollout.n
        batch.non_tensor_batch["uid"] = np.array([f"{step}-{gen_index}-{i}" for i in range(len(batch))], dtype=object)
        batch.non_tensor_batch["dispatch_step"] = np.full(len(batch), self.global_step, dtype=np.int64)
        gen_batch = generation_batch(batch).repeat(n, interleave=True)
        gen_batch.meta_info["seed"] = self._seed("train", gen_index, step)
        return batch.repeat(n, interleave=True), gen_batch

    def _freshness_due(self) -> bool:
        """At step 1 (no update yet: the reference for the log-prob drift), step 2 (the first whose
        engine must have received an update) and every ``trainer.freshness_check_freq`` steps: a
        function of the step, so a resumed run probes where the uninterrupted one did."""
        freq = self.config.trainer.freshness_check_freq
        return freq > 0 and (self.global_step <= 2 or self.global_step % freq == 0)

    def _check_engine_parity(self, batch: DataProto) -> dict[str, float]:
        """The engine's log-probs of the samples the actor's current weights generated against the
        actor's own, before this step's update (``guards.EngineParity``): the parity guard at step
        1, the drift check after. Async runs with samples behind the actor (k >= 1) and bypass mode
        (pi_old is the rollout's) have no such pair after step 1: the freshness probe measures theirs."""
        rollout = self.config.actor_rollout_ref.rollout
        truncated = rollout.top_k > 0 or rollout.top_p < 1.0 or rollout.min_p > 0.0  # log-probs of the kept tokens,
        if (self.config.trainer.freshness_check_freq <= 0 or self.config.algorithm.rollout_correction.bypass_mode
                or truncated):  # renormalised (as vLLM reports them), not the actor's: the probe's greedy ones are
            return {}
        b = batch.batch
        fresh = torch.as_tensor(np.asarray(batch.non_tensor_batch["policy_version"]) == self.global_step - 1)
        # the tokens that carry loss: a dropped group's rows (a NaN score) get no log-probs from the update's forward
        mask = loss_mask(batch).bool() & fresh[:, None].to(b["response_mask"].device)  # (bs, R)
        return self.parity.check(b["rollout_log_probs"], b["old_log_probs"], mask, self.global_step)

    def _check_freshness(self) -> dict[str, float]:
        """The rollout engine holds the actor's weights (verl #7495, ms-swift #9855: a sampler that
        never receives the new policy trains on silently). The training data's first prompts (a
        batch's worth) are decoded greedily by the engine, with the actor's current version
        (async: after its queued work, loading that version); the actor then scores those tokens
        at a near-zero temperature, which gives each token's logit gap to the actor's own argmax.
        A fresh engine's tokens are the actor's greedy tokens: every gap is 0, or within
        ``freshness_tolerance`` where two precisions split a near-tie (in 16 bits two rounding
        steps at the largest |logit| the actor computed for the probe). A larger gap stops the
        run, naming what was found."""
        dataset = self.loader.dataset  # its first rows: the same prompts in every process, the stream untouched
        prompts = dataset.collate([dataset[i] for i in range(min(len(dataset), self.config.data.train_batch_size))])
        prompts.non_tensor_batch["uid"] = np.array([f"probe-{i}" for i in range(len(prompts))], dtype=object)
        probe = generation_batch(prompts)
        probe.meta_info.update(do_sample=False, seed=self._seed("greedy"),
                               max_new_tokens=min(PROBE_TOKENS, self.config.data.max_response_length))
        version = self.global_step - 1  # the actor's, before this step's update
        if self.ahead is None:
            out = self.rollout_wg.generate_sequences(probe)
        else:
            out = self.ahead.run(lambda: self.rollout_wg.generate_sequences(probe), version)
        out.meta_info.update(temperature=GAP_TEMPERATURE, max_abs_logit=True)
        scored = self.wg.compute_log_prob(out).batch
        mask = out.batch["response_mask"].bool()  # the engine's own tokens (tool output apart)
        gaps = torch.where(mask, -GAP_TEMPERATURE * scored["old_log_probs"].float(), torch.zeros(())).clamp_min(0.0)
        largest = float(torch.where(mask, scored["max_abs_logits"].float(), torch.zeros(())).max())
        worst, tolerance = float(gaps.max()), freshness_tolerance(self.config, largest)
        if worst > tolerance:
            row, col = divmod(int(gaps.argmax()), gaps.shape[1])
            token = int(out.batch["responses"][row, col])
            raise StopTraining(
                f"step {self.global_step}: the rollout engine does not hold the actor's weights (version {version}): "
                f"its greedy token {col + 1} of prompt {row + 1} ({self.tokenizer.decode([token])!r}) trails the actor's "
                f"own greedy token by {worst:.3g} logits (tolerance {tolerance:g}, from the actor's and the engine's "
                f"dtypes and the largest |logit|, {largest:.3g}); {int((gaps > tolerance).sum())} of {int(mask.sum())} "
                "probe tokens differ. The weight sync to the engine did not take effect: the run stops before "
                "training on a stale policy's samples (trainer.freshness_check_freq=-1 turns this probe off)")
        # the engine's log-probs of its greedy tokens (temperature 1) against the actor's: a partly stale
        # engine drifts before its argmax moves
        out.meta_info.update(temperature=1.0, max_abs_logit=False)
        actor = self.wg.compute_log_prob(out).batch["old_log_probs"]
        drift = self.parity.check(out.batch["rollout_log_probs"], actor, mask, self.global_step, what="greedy probe",
                                  prefix="training/freshness", max_abs_logit=largest)
        return {"training/freshness/greedy_gap_max": worst, "training/freshness/greedy_gap_tolerance": tolerance,
                "training/freshness/max_abs_logit": largest, "training/freshness/probe_tokens": float(mask.sum()),
                **drift}

    def _rollout_ahead(self, timings: dict[str, float]):
        """Async: dispatch the batches up to step + k (the actor holds version step - 1, what the
        last of them needs), then this step's batch, generated ahead, scored. The next batch to
        dispatch follows the last one queued (none queued: this step's)."""
        last = min(self.global_step + self.ahead.ahead, self.total_training_steps)  # none past the run's end
        for step in range(max(self.ahead.pending, default=self.global_step - 1) + 1, last + 1):
            prompts, epoch = next(self._prompt_batches)
            batch, gen_batch = self._dispatch(prompts, step, 0)
            with self.progress.stage("sync_weights", timings):  # a new version is sent now: copied, or broadcast to a pool
                self.ahead.dispatch(Dispatched(step, batch, epoch), gen_batch, self.global_step - 1)
        with self.progress.stage("wait_gen", timings):
            item = self.ahead.take(self.global_step)
        timings.update(item.timings)
        self._check_span(item)
        self._check_version(item.output.non_tensor_batch["policy_version"],
                            int(item.batch.non_tensor_batch["dispatch_step"].max()))
        # the step's unions (log-probs, scores, advantages) go into a copy of the batch's key maps, never
        # into the queued batch: an interrupt before the update saves it as the engine returned it
        return self._score(expand_to_samples(item.batch.select(), item.output).union(item.output), 0, timings)

    def _check_version(self, versions: np.ndarray, dispatch_step: int) -> None:
        """The engine generated with the weights it was sent: a batch dispatched during step d is
        generated by version d - 1 (what the actor held then), as the engine stamps it. An engine
        that kept older weights (a load that never reached it) stops the run here, before its
        samples are trained as if they were fresh."""
        stale = versions != dispatch_step - 1
        if stale.any():
            raise StopTraining(f"step {self.global_step}: the rollout engine generated {int(stale.sum())} of "
                               f"{len(versions)} samples with weight version {int(versions[stale][0])}, but it was "
                               f"sent version {dispatch_step - 1} (the actor's at dispatch): its weights are stale; "
                               "the weight sync to the rollout workers did not take effect")

    def _check_span(self, item: Dispatched) -> None:
        """No trained batch spans more weight versions than ``max_off_policy_threshold``: the fixed
        schedule keeps every span at num_warmup_batches + 1 at most (the load refuses a lower
        threshold), so a longer one is a bug in the schedule, stopped here, never trained on."""
        sampler = self.config.trainer.v1.sampler
        dispatched = int(item.batch.non_tensor_batch["dispatch_step"].max())
        span = self.global_step - dispatched + 1
        if span > sampler.max_off_policy_threshold:
            raise RuntimeError(f"step {self.global_step}: its batch was dispatched at step {dispatched} and spans {span} "
                               f"weight versions, over trainer.v1.sampler.max_off_policy_threshold = "
                               f"{sampler.max_off_policy_threshold} (max_off_policy_strategy="
                               f"{sampler.max_off_policy_strategy} is never needed by the fixed schedule): a bug")

    def _score(self, batch: DataProto, gen_index: int, timings: dict[str, float], gen_batch: DataProto | None = None):
        """The generated batch scored (or being scored): (the batch, the reward or its future).
        ReMax's greedy baselines need ``gen_batch`` (synchronous runs only)."""
        cfg = self.config
        batch.meta_info["temperature"] = cfg.actor_rollout_ref.rollout.temperature
        if cfg.algorithm.adv_estimator == "remax":
            with self.progress.stage("gen_max", timings):
                batch.batch["reward_baselines"] = self._greedy_baselines(gen_batch, batch, gen_index)
        if self.reward_model is not None:
            with self.progress.stage("reward_model", timings):
                batch = batch.union(self.reward_model.compute_rm_score(batch))
        # an agent's episode in several samples is scored once, on its last (its final context)
        scored = batch if episode_rows(batch) is None else batch.select_idxs(final_samples(batch))
        with self.progress.stage("reward", timings):
            reward = self.reward_fn.submit(scored) if cfg.reward.launch_reward_fn_async else self.reward_fn(scored)
        return batch, reward

    def _attach_scores(self, batch: DataProto, reward) -> dict[str, float]:
        """``token_level_scores`` (plus the reward model's, weighted) and the scorers' extras into
        ``batch``; returns the reward metrics."""
        reward = reward.result() if hasattr(reward, "result") else reward
        rows = episode_rows(batch)
        if rows is not None:  # the episodes' scores (``_score``), one row per sample, for the reward model's
            reward = reward.select(rows)
        if "rm_scores" in batch.batch:  # weighted; a NaN is dropped as a rule scorer's NaN is
            reward = add_reward_model_scores(reward, batch.batch["rm_scores"], self.config.reward,
                                             batch.non_tensor_batch[self.config.data.reward_fn_key])
        if rows is not None:  # every sample gets its final context's score, on its own last token
            last = np.flatnonzero(final_samples(batch))
            reward = share_episode_scores(reward.select(last), rows, batch.batch["response_mask"])
        scores = reward.token_level_scores.to(batch.batch["response_mask"].device)
        batch.batch["token_level_scores"] = scores
        for key, values in reward.reward_extra_info.items():
            batch.non_tensor_batch[key] = values
        if reward.scores is not None:
            batch.batch["sample_scores"] = reward.scores.to(scores.device)
        metrics = dict(reward.metrics)
        if reward.invalid is not None and reward.invalid.any():
            metrics["training/dropped_groups"] = float(self._drop_groups(batch, reward.invalid.numpy()))
        return metrics

    def _drop_groups(self, batch: DataProto, rows: np.ndarray) -> int:
        """Leave every group with a row in ``rows`` (bool) out of the update: its tokens carry no
        loss (``train_mask``) and the advantage estimator does not see them, so its placeholder
        scores never become a gradient nor shift another group's; returns how many."""
        uids = batch.non_tensor_batch["uid"]
        groups = list(dict.fromkeys(uid_list(uids[rows])))  # by value, as the estimators group
        kept = torch.as_tensor(~in_groups(uids, groups), dtype=batch.batch["response_mask"].dtype)  # (bs,)
        narrow_train_mask(batch, kept[:, None])
        batch.meta_info["dropped_groups"] = groups  # nor do they reach the advantage estimator
        return len(groups)

    def _dynamic_sampling(self, batch: DataProto, more_batches: Iterator[DataProto], metrics: dict[str, float],
                          timings: dict[str, float]) -> DataProto:
        """DAPO: generate and score batches, keep the groups whose ``filter_groups.metric`` varies,
        until ``train_batch_size`` groups are kept (the last batch's surplus is left out)."""
        cfg = self.config
        groups_cfg, n, want = cfg.algorithm.filter_groups, cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size
        kept, kept_groups, seen_groups, reward_metrics = [], 0, 0, defaultdict(list)
        for gen_index in itertools.count():
            if gen_index:
                batch = next(more_batches)
            batch, reward = self._rollout(batch, gen_index, timings)
            for key, value in self._attach_scores(batch, reward).items():
                reward_metrics[key].append(value)
            keep = filter_groups(batch.non_tensor_batch["uid"], self._filter_metric(batch))  # (bs,)
            # groups dropped for an invalid reward are never kept (their train_mask goes with them)
            dropped = in_groups(batch.non_tensor_batch["uid"], batch.meta_info.pop("dropped_groups", []))
            keep = keep & ~torch.as_tensor(dropped, device=keep.device)
            batch.batch.pop("train_mask", None)
            kept.append(batch.select_idxs(keep.numpy()))
            kept_groups += len(set(batch.non_tensor_batch["uid"][keep.numpy()]))  # an episode may be several rows
            seen_groups += len(set(batch.non_tensor_batch["uid"]))
            if kept_groups >= want:
                break
            if 0 < groups_cfg.max_num_gen_batches <= gen_index + 1:
                raise DynamicSamplingError(
                    f"step {self.global_step}: {gen_index + 1} generation batches (algorithm.filter_groups."
                    f"max_num_gen_batches) of {len(batch) // n} prompts kept {kept_groups} of {seen_groups} groups "
                    f"whose {groups_cfg.metric!r} varies, fewer than data.train_batch_size = {want}: most prompts are "
                    "all right or all wrong for this policy. Raise max_num_gen_batches (<= 0: no limit) or "
                    "data.gen_batch_size, use data the policy solves sometimes, or set filter_groups.enable=false")
        extra_keys = set().union(*(part.non_tensor_batch for part in kept))
        for part in kept:  # a scorer's extra value may appear in one generation batch only
            for key in extra_keys - set(part.non_tensor_batch):
                part.non_tensor_batch[key] = np.full(len(part), None, dtype=object)
        metrics.update({k: float(np.sum(v) if k.startswith("reward/num_") else np.mean(v))
                        for k, v in reward_metrics.items()})
        metrics.update({"dapo/num_gen_batches": float(gen_index + 1), "dapo/kept_groups": float(kept_groups),
                        "dapo/filtered_groups": float(seen_groups - kept_groups)})
        joined = concat_rollouts(kept, self.tokenizer.pad_token_id)
        uids = joined.non_tensor_batch["uid"]
        first_groups = set(list(dict.fromkeys(uids))[:want])
        return joined.select_idxs(np.array([u in first_groups for u in uids], dtype=bool))

    def _filter_metric(self, batch: DataProto) -> torch.Tensor:
        """(bs,) the value dynamic sampling requires to vary within a group."""
        metric = self.config.algorithm.filter_groups.metric
        if metric == "seq_reward":
            return batch.batch["token_level_scores"].sum(-1)
        if metric == "acc" and "acc" in batch.non_tensor_batch:
            return torch.tensor([float(a) if a is not None else float("nan") for a in batch.non_tensor_batch["acc"]])
        return batch.batch["sample_scores"]

    def _advantages(self, batch: DataProto) -> dict[str, float]:
        """token_level_scores -> token_level_rewards (KL in reward) -> advantages and returns.

        The estimator sees what the update trains: the rows of the groups kept, with the loss mask
        (``train_mask``) as their ``response_mask``. So tokens rollout correction rejected are out of
        REINFORCE++'s returns, the whitening (REINFORCE++, its baseline variant, GAE) and OPO's lengths,
        as in verl, which narrows ``response_mask`` before ``compute_advantage``; so are the rows whose
        teacher log-probs are not finite. The batch's ``response_mask`` stays the sampled tokens."""
        algo = self.config.algorithm
        metrics = {}
        scores = batch.batch["token_level_scores"]
        if algo.use_kl_in_reward:
            rewards, metrics = apply_kl_penalty(scores, batch.batch["old_log_probs"], batch.batch["ref_log_prob"],
                                                batch.batch["response_mask"], self.kl_ctrl, algo.kl_penalty)
            batch.batch["token_level_rewards"] = rewards
        else:
            batch.batch["token_level_rewards"] = scores
        uids = batch.non_tensor_batch["uid"]
        check_groups(uids, self.config.actor_rollout_ref.rollout.n, self.global_step, episode_rows(batch))
        check_masks(batch, self.global_step)
        dropped = in_groups(uids, batch.meta_info.get("dropped_groups", []))
        # the kept groups only: a batch-wide whitening (REINFORCE++, GAE) over the dropped groups'
        # placeholder scores would shift, even flip, the kept groups' advantages. Either way a key map of
        # its own, whose response_mask is replaced
        kept = batch.select_idxs(~dropped) if dropped.any() else batch.select()
        kept.batch["response_mask"] = loss_mask(kept)
        compute_advantage(kept, algo)
        rows = torch.as_tensor(~dropped)
        for key in ("advantages", "returns"):
            full = kept.batch[key].new_zeros((len(batch), *kept.batch[key].shape[1:]))
            full[rows] = kept.batch[key]
            batch.batch[key] = full
        return metrics

    def _screen_teacher(self, batch: DataProto) -> dict[str, float]:
        """A sample whose teacher log-probs are not finite carries no loss (counted, as a NaN
        reward's group is); returns the teacher's metrics."""
        keep, metrics = screen_teacher_log_probs(batch)
        if not bool(keep.all()):
            narrow_train_mask(batch, keep.to(batch.batch["response_mask"].dtype)[:, None])
        return metrics

    def _correct_rollout(self, batch: DataProto) -> dict[str, float]:
        """``algorithm.rollout_correction``: bypass mode takes pi_old from the rollout's log-probs;
        otherwise the weights pi_old / pi_rollout (``rollout_is_weights``) and the rejection mask
        (into ``train_mask``) of the whole batch go to the advantage estimator (``_advantages``) and
        the update. The KL-in-reward penalty still reads the whole ``response_mask``, as verl's,
        computed before its rejection."""
        rc = self.config.algorithm.rollout_correction
        b = batch.batch
        if rc.bypass_mode:
            b["old_log_probs"] = b["rollout_log_probs"].clone()
            batch.meta_info["old_log_probs_source"] = "rollout"  # no engine-against-actor metric from these
            return {}
        if not is_active(rc):
            return {}
        weights, loss_mask, metrics = rollout_correction(b["old_log_probs"], b["rollout_log_probs"],
                                                         b["response_mask"].float(), rc)
        if weights is not None:
            b["rollout_is_weights"] = weights
        if rc.rollout_rs is not None:
            narrow_train_mask(batch, loss_mask)
        return metrics

    def _greedy_baselines(self, gen_batch: DataProto, batch: DataProto, gen_index: int = 0) -> torch.Tensor:
        """ReMax: the score of each prompt's greedy response, the baseline of its samples, scored as
        the samples are: with the reward model, its score x weight (plus the rule score with
        ``add_rule_scores``), as verl takes the greedy response's ``rm_scores`` when there are any."""
        cfg = self.config
        rows = np.arange(0, len(gen_batch), cfg.actor_rollout_ref.rollout.n)  # one row per prompt
        greedy = gen_batch.select_idxs(rows)
        greedy.meta_info.update(do_sample=False, seed=self._seed("greedy", gen_index))
        out = self.rollout_wg.generate_sequences(greedy)
        out = out.select_idxs(final_samples(out))  # an agent's split episode: its final context
        scored = DataProto(batch=dict(out.batch), non_tensor_batch={
            key: batch.non_tensor_batch[key][rows]  # the reward model reads the chat prompt (raw_prompt) too
            for key in (cfg.data.reward_fn_key, "reward_model", "extra_info", "raw_prompt")
            if key in batch.non_tensor_batch})
        for key in TRAJECTORY_KEYS:  # multi-turn: the greedy trajectory's own turns, as its samples have theirs
            if key in out.non_tensor_batch:
                scored.non_tensor_batch[key] = out.non_tensor_batch[key]
        reward = self.reward_fn(scored)
        if self.reward_model is not None:
            rm_scores = self.reward_model.compute_rm_score(scored).batch["rm_scores"]
            sources = scored.non_tensor_batch[cfg.data.reward_fn_key]
            reward = add_reward_model_scores(reward, rm_scores, cfg.reward, sources)
        baseline = reward.token_level_scores.sum(-1)  # (prompts,)
        per_episode = baseline.repeat_interleave(self.config.actor_rollout_ref.rollout.n)
        rows = episode_rows(batch)
        return per_episode if rows is None else per_episode[torch.as_tensor(rows)]

    def _dump_rollouts(self, batch: DataProto, folder: Path) -> None:
        """One JSON line per sample: prompt, response, score, and the scorer's extras."""
        folder.mkdir(parents=True, exist_ok=True)
        decode = self.tokenizer.decode
        R = batch.batch["responses"].shape[1]
        path = folder / f"{self.global_step}.jsonl"
        tmp = path.with_name(f".{path.name}.tmp")  # renamed when whole: a repeated step replaces it
        with open(tmp, "w") as f:
            for i in range(len(batch)):
                prompt_mask = batch.batch["attention_mask"][i, :-R].bool()
                row = {"step": self.global_step, "uid": str(batch.non_tensor_batch["uid"][i]),
                       "prompt": decode(batch.batch["input_ids"][i, :-R][prompt_mask], skip_special_tokens=False),
                       "response": decode(batch.batch["responses"][i][batch.batch["attention_mask"][i, -R:].bool()],
                                          skip_special_tokens=True),
                       "score": float(batch.batch["token_level_scores"][i].sum()),
                       "advantage": float(batch.batch["advantages"][i][loss_mask(batch)[i].bool()][:1].sum())}
                for key in ("policy_version", "dispatch_step"):  # which weights generated it, dispatched when
                    if key in batch.non_tensor_batch:
                        row[key] = int(batch.non_tensor_batch[key][i])
                for key in ("data_source", "reward_model", "num_turns", "messages", "tool_rewards", "turn_scores"):
                    if key in batch.non_tensor_batch:  # multi-turn: the conversation, each call and result
                        row[key] = batch.non_tensor_batch[key][i]
                f.write(json.dumps(row, default=str) + "\n")
        tmp.replace(path)

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """``val_kwargs.n`` responses per validation prompt, sampled as ``val_kwargs`` says
        (greedy by default: ``mean@1`` is greedy accuracy), scored and reported as verl does."""
        val = self.config.actor_rollout_ref.rollout.val_kwargs
        sampling = {"do_sample": val.do_sample}
        if val.do_sample:
            sampling.update(temperature=val.temperature, top_p=val.top_p, top_k=val.top_k)
        return self._validation_pass(n=val.n, sampling=sampling)

    def _validation_pass(self, n: int, sampling: dict[str, Any]) -> dict[str, float]:
        generate = self.rollout_wg.generate_sequences
        if self.ahead is not None:
            # async: each generation on the engine, after the batches queued before it, with the weights of
            # the last complete step; the scoring stays in this thread, where reward.timeout_s's timer acts
            version = self._completed["global_step"]

            def generate(batch: DataProto, on_engine=generate) -> DataProto:
                return self.ahead.run(lambda: on_engine(batch), version)
        return evaluate(generate, self.val_reward_fn, self.val_dataset, self.tokenizer, n, sampling,
                        self.config.data.val_batch_size, self._seed("val"), self.config.data.reward_fn_key,
                        progress="validation" if self.tracker.progress_bar else None)
