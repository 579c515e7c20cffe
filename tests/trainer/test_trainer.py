"""End to end on the tiny model: every advantage estimator and KL placement runs a few steps,
with finite losses, changed weights and verl's metric names logged."""

import json
import math
import re

import pytest
import torch

from rlvr.algos import ADV_ESTIMATORS
from rlvr.cli import main
from rlvr.data.io import DatasetError, write_parquet
from rlvr.trainer.main import build_trainer

STEP_METRICS = [
    "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/entropy",
    "actor/grad_norm", "actor/lr", "critic/score/mean", "critic/score/max", "critic/score/min",
    "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min", "response_length/mean",
    "response_length/max", "response_length/min", "response_length/clip_ratio", "prompt_length/mean",
    "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor",
    "timing_s/step", "perf/total_num_tokens", "perf/time_per_step", "perf/throughput", "training/global_step",
    "training/epoch", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
]


def run(config):
    trainer = build_trainer(config, progress_bar=False)
    before = [p.detach().clone() for p in trainer.wg.worker.actor.model.parameters()]
    last = trainer.fit()
    trainer.tracker.close()
    after = list(trainer.wg.worker.actor.model.parameters())
    changed = any(not torch.equal(a, b) for a, b in zip(before, after))
    return trainer, last, changed


def read_metrics(config):
    from pathlib import Path
    return [json.loads(line) for line in open(Path(config.trainer.default_local_dir) / "metrics.jsonl")]


@pytest.mark.parametrize("estimator", ADV_ESTIMATORS.names())
def test_each_estimator_trains(tiny_config, estimator):
    config = tiny_config(f"algorithm.adv_estimator={estimator}", "trainer.val_before_train=false",
                         "data.val_files=[]")
    trainer, last, changed = run(config)
    assert changed
    assert trainer.global_step == 2
    for key in STEP_METRICS:
        assert key in last and math.isfinite(last[key]), key
    if estimator == "gae":
        assert "critic/vf_loss" in last and math.isfinite(last["critic/vf_loss"])
        assert "critic/values/mean" in last


@pytest.mark.parametrize("placement", ["kl_loss", "kl_in_reward", "none"])
def test_kl_placements(tiny_config, placement):
    overrides = {
        "kl_loss": ["actor_rollout_ref.actor.use_kl_loss=true", "algorithm.use_kl_in_reward=false"],
        "kl_in_reward": ["actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true"],
        "none": ["actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false"],
    }[placement]
    config = tiny_config(*overrides, "trainer.val_before_train=false", "data.val_files=[]")
    trainer, last, changed = run(config)
    assert changed
    worker = trainer.wg.worker
    assert (worker.ref is None) == (placement == "none")  # no reference unless a KL term uses it
    assert ("actor/kl_loss" in last) == (placement == "kl_loss")
    assert ("actor/reward_kl_penalty" in last) == (placement == "kl_in_reward")
    assert ("timing_s/ref" in last) == (placement != "none")


def test_reference_equals_actor_at_step_zero(tiny_config):
    from rlvr.trainer.evaluate import generation_batch

    config = tiny_config("trainer.val_before_train=false")
    trainer = build_trainer(config, progress_bar=False)
    batch = next(iter(trainer.loader))
    import numpy as np
    batch.non_tensor_batch["uid"] = np.array(["a", "b"], dtype=object)
    gen = generation_batch(batch).repeat(3)
    batch = batch.repeat(3).union(trainer.wg.generate_sequences(gen))
    old = trainer.wg.compute_log_prob(batch).batch["old_log_probs"]
    ref = trainer.wg.compute_ref_log_prob(batch).batch["ref_log_prob"]
    assert torch.equal(old, ref)
    trainer.tracker.close()


def test_validation_metrics_and_jsonl(tiny_config):
    config = tiny_config("trainer.val_before_train=true", "trainer.test_freq=2", "actor_rollout_ref.rollout.val_kwargs.n=4",
                         "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                         "actor_rollout_ref.rollout.val_kwargs.temperature=1.0")
    trainer, last, _ = run(config)
    records = read_metrics(config)
    assert [r["step"] for r in records] == [0, 1, 2]
    for key in ("val-core/arithmetic/reward/mean@4", "val-core/arithmetic/reward/best@4/mean",
                "val-core/arithmetic/reward/maj@4/mean", "val-aux/arithmetic/reward/std@4",
                "val-aux/arithmetic/reward/best@2/mean", "val-aux/arithmetic/reward/worst@4/mean"):
        assert key in records[0] and key in records[2], key
    assert "val-core/arithmetic/reward/mean@1" not in records[0]  # one pass, as val_kwargs says (verl)
    assert "timing_s/testing" in records[2] and "timing_s/testing" not in records[1]
    # sampled: the 4 samples of a prompt differ, so the best of 4 beats their mean somewhere
    assert records[2]["val-core/arithmetic/reward/best@4/mean"] > records[2]["val-core/arithmetic/reward/mean@4"]


def test_val_kwargs_do_sample_false_is_greedy(tiny_config):
    """do_sample=false with n=4: four identical greedy answers per prompt (std 0, best = mean)."""
    config = tiny_config("trainer.val_before_train=true", "trainer.total_training_steps=1",
                         "actor_rollout_ref.rollout.val_kwargs.n=4", "actor_rollout_ref.rollout.val_kwargs.do_sample=false")
    trainer = build_trainer(config, progress_bar=False)
    metrics = trainer.validate()
    trainer.tracker.close()
    assert metrics["val-aux/arithmetic/reward/std@4"] == 0.0
    assert metrics["val-core/arithmetic/reward/best@4/mean"] == metrics["val-core/arithmetic/reward/mean@4"]


def test_validation_shows_its_progress(tiny_config, capsys):
    """Validation (40-50 s in the default job) shows a bar of the prompts scored, per batch of
    data.val_batch_size, as the training loop shows its steps; none without the progress bar."""
    trainer = build_trainer(tiny_config("data.val_batch_size=2"), progress_bar=True)
    trainer.validate()
    err = capsys.readouterr().err
    assert re.search(r"validation: +50%.*\| 2/4 \[", err) and re.search(r"validation: +100%.*\| 4/4 \[", err), err
    trainer.tracker.progress_bar = False
    trainer.validate()
    assert "validation" not in capsys.readouterr().err
    trainer.tracker.close()


def test_save_and_test_freq_minus_one_neither_save_nor_validate_at_the_end(tiny_config, tmp_path):
    config = tiny_config("trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.test_freq=-1")
    run(config)
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert not any(k.startswith("val-") for r in read_metrics(config) for k in r)
    config = tiny_config("trainer.val_before_train=false", "trainer.save_freq=5", "trainer.test_freq=5",
                         f"trainer.default_local_dir={tmp_path / 'final'}")
    run(config)  # 2 steps with frequencies of 5: both happen at the last step
    assert (tmp_path / "final" / "checkpoints" / "global_step_2").is_dir()
    assert "val-core/arithmetic/reward/mean@1" in read_metrics(config)[-1]


def test_rollout_dump(tiny_config, tmp_path):
    config = tiny_config(f"trainer.rollout_data_dir={tmp_path / 'dump'}", "trainer.val_before_train=false",
                         "trainer.total_training_steps=1")
    run(config)
    rows = [json.loads(line) for line in open(tmp_path / "dump" / "1.jsonl")]
    assert len(rows) == 6
    assert {"prompt", "response", "score", "advantage", "uid", "data_source"} <= set(rows[0])
    assert "What is" in rows[0]["prompt"]


def test_unscorable_data_source_is_refused(tiny_config, tmp_path, tiny_data):
    from rlvr.data.io import read_rows
    rows = read_rows(tiny_data["train"])
    rows[3]["data_source"] = "my/unknown_task"
    bad = write_parquet(rows, tmp_path / "bad.parquet")
    config = tiny_config(f"data.train_files=[{bad}]", custom_reward=False)
    with pytest.raises(DatasetError, match=r"bad.parquet.*row 3.*my/unknown_task"):
        build_trainer(config, progress_bar=False)


@pytest.mark.parametrize("reward_model", ["absent", "no_truth", "none"])
def test_rows_without_ground_truth_are_refused_at_load(tiny_config, tmp_path, tiny_data, reward_model):
    """As a new user writes them (data_source and prompt only): refused when the dataset loads,
    naming the file, row and key, instead of scoring 0 at every step."""
    from rlvr.data.io import read_rows
    rows = read_rows(tiny_data["train"])
    if reward_model == "absent":
        del rows[5]["reward_model"]
    elif reward_model == "none":
        rows[5]["reward_model"] = None
    else:
        rows[5]["reward_model"]["ground_truth"] = None
    bad = write_parquet(rows, tmp_path / "no_truth.parquet")
    config = tiny_config(f"data.train_files=[{bad}]", custom_reward=False)
    with pytest.raises(DatasetError, match=r"no_truth.parquet.*row 5.*'reward_model.ground_truth' is missing.*"
                                           r"'arithmetic'"):
        build_trainer(config, progress_bar=False)
    # a scorer that does not read the ground truth accepts the rows
    fmt = tiny_config(f"data.train_files=[{bad}]", "reward.functions=[{name: mark, weight: 1.0}]", custom_reward=False)
    build_trainer(fmt, progress_bar=False).tracker.close()


@pytest.mark.parametrize("truth", ["", "   "])
def test_rows_with_an_empty_ground_truth_are_refused_at_load(tiny_config, tmp_path, tiny_data, truth):
    """An empty ground truth scores every answer as wrong: the row would train on reward 0 at every step."""
    from rlvr.data.io import read_rows
    rows = read_rows(tiny_data["train"])
    rows[2]["reward_model"]["ground_truth"] = truth
    bad = write_parquet(rows, tmp_path / "empty_truth.parquet")
    with pytest.raises(DatasetError, match=r"empty_truth.parquet.*row 2.*'reward_model.ground_truth' is empty"):
        build_trainer(tiny_config(f"data.train_files=[{bad}]", custom_reward=False), progress_bar=False)
    from rlvr.trainer.main import is_empty
    assert is_empty([]) and is_empty({}) and not is_empty(0) and not is_empty(["3"]) and not is_empty("0")


def test_prompts_dropped_as_overlong_are_reported_at_load(tiny_config, tmp_path, tiny_data, capsys):
    from rlvr.data.io import read_rows
    rows = read_rows(tiny_data["train"])
    for r in rows[:12]:  # 12 of the 16 rows far over 128 tokens
        r["prompt"][0]["content"] = "word " * 300
    long = write_parquet(rows, tmp_path / "long.parquet")
    build_trainer(tiny_config(f"data.train_files=[{long}]"), progress_bar=False).tracker.close()
    err = capsys.readouterr().err
    assert ("[rlvr] data.train_files: 12 of 16 rows dropped: their prompt is longer than "
            "data.max_prompt_length=128 tokens") in err
    assert "4 rows remain" in err and "data.val_files" not in err  # the validation rows all fit


def test_cli_errors_are_clear(tiny_model_dir, tmp_path, capsys):
    assert main(["train", "actor_rollout_ref.model.path=/no/such/model", f"trainer.default_local_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "/no/such/model" in err and "Traceback" not in err
    # refused at load (a mini-batch that does not divide the batch is not: the last one is smaller, as in verl)
    assert main(["train", "data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]) == 2
    assert "larger than data.train_batch_size = 3" in capsys.readouterr().err


def test_a_run_whose_rewards_all_fail_stops_with_a_message(tiny_config, tmp_path, capsys):
    """Every sample's reward raises: the first step stops the run with the first failure, as a
    message without a traceback, instead of training 24 steps on failure scores."""
    from rlvr.config import to_yaml

    broken = tmp_path / "broken.py"
    broken.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(ground_truth['missing'])\n")
    config = tiny_config(f"reward.custom_reward_function.path={broken}", "trainer.val_before_train=false")
    (tmp_path / "config.yaml").write_text(to_yaml(config))
    assert main(["train", "--config", str(tmp_path / "config.yaml")]) == 2
    err = capsys.readouterr().err
    assert "6 of 6 samples failed to score" in err and "TypeError" in err and "Traceback" not in err


def test_on_policy_shortcut_matches_separate_old_log_prob_pass(tiny_config, tmp_path):
    """One optimizer step per batch: old_log_probs from the update's own forward give the same
    training as a separate pass (the ratio is 1 either way), one forward pass cheaper."""
    results = {}
    for recompute in (True, False):
        config = tiny_config("actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.val_before_train=false",
                             "data.val_files=[]", f"actor_rollout_ref.actor.recompute_old_log_prob={recompute}",
                             f"trainer.default_local_dir={tmp_path / str(recompute)}")
        trainer, last, _ = run(config)
        results[recompute] = (last, [p.detach().clone() for p in trainer.wg.worker.actor.model.parameters()])
    (sep, sep_params), (short, short_params) = results[True], results[False]
    assert "timing_s/old_log_prob" in sep and "timing_s/old_log_prob" not in short
    assert short["actor/ppo_kl"] == 0.0 and abs(sep["actor/ppo_kl"]) < 1e-6
    assert short["critic/score/mean"] == sep["critic/score/mean"]
    assert short["training/rollout_probs_diff_max"] < 1e-3
    for a, b in zip(sep_params, short_params):
        assert torch.allclose(a, b, atol=1e-5)


def test_custom_estimator_and_verl_signature_loss_from_a_user_file(tiny_config, tmp_path, custom_algos_file):
    """custom_modules registers a user's estimator and a policy loss written with verl's signature
    (no mini-batch totals); the loss is weighed per micro-batch so training equals the built-in
    loss with the same math (gpg: -A * log_prob), with 3 micro-batches per mini-batch."""
    module = custom_algos_file
    weights = {}
    for loss_mode in ("gpg", "test_verl_signature"):
        config = tiny_config(f"custom_modules=[{module}]", "algorithm.adv_estimator=test_sign_adv",
                             f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "trainer.val_before_train=false",
                             "data.val_files=[]", f"trainer.default_local_dir={tmp_path / loss_mode}")
        trainer, last, changed = run(config)
        assert changed
        weights[loss_mode] = [p.detach().clone() for p in trainer.wg.worker.actor.model.parameters()]
        rows = [json.loads(line) for line in open(tmp_path / loss_mode / "rollouts" / "2.jsonl")]
        assert all(r["advantage"] == (1.0 if r["score"] > 0.5 else -1.0) for r in rows)  # the user's estimator
    for a, b in zip(weights["gpg"], weights["test_verl_signature"]):
        assert torch.allclose(a, b, atol=1e-6)


DAPO_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Even answers: always right (a group with no spread); odd answers: right for even-length text."""
    acc = 1.0 if int(ground_truth) % 2 == 0 else float(len(solution_str) % 2 == 0)
    return {"score": acc, "acc": acc}
'''


def test_dapo_dynamic_sampling_keeps_only_groups_with_signal(tiny_config, tmp_path):
    reward = tmp_path / "dapo_reward.py"
    reward.write_text(DAPO_REWARD)
    config = tiny_config("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc",
                         "data.gen_batch_size=2", "trainer.total_training_steps=3", "trainer.val_before_train=false",
                         "data.val_files=[]", f"reward.custom_reward_function.path={reward}",
                         "reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4",
                         "actor_rollout_ref.actor.clip_ratio_high=0.28")
    trainer, last, changed = run(config)
    assert changed
    records = read_metrics(config)
    assert sum(r["dapo/filtered_groups"] for r in records) > 0  # even answers were filtered out
    for r in records:
        assert r["dapo/kept_groups"] >= 2 and r["dapo/num_gen_batches"] >= 1
    for step in (1, 2, 3):
        rows = [json.loads(line) for line in open(tmp_path / "run" / "rollouts" / f"{step}.jsonl")]
        assert len(rows) == 2 * 3  # exactly train_batch_size groups of n
        by_group = {}
        for row in rows:
            by_group.setdefault(row["uid"], set()).add(int(row["reward_model"]["ground_truth"]) % 2)
        assert all(parities == {1} for parities in by_group.values())  # every kept prompt has an odd answer
        assert len(by_group) == 2


@pytest.mark.parametrize("metric", ["score", "seq_reward", "acc"])  # acc: a float scorer reports none, its score counts
def test_dapo_gives_up_after_max_num_gen_batches(tiny_config, tmp_path, metric):
    from rlvr.trainer.ppo_trainer import DynamicSamplingError

    reward = tmp_path / "constant.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    config = tiny_config("algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=3",
                         f"algorithm.filter_groups.metric={metric}", "trainer.val_before_train=false", "data.val_files=[]",
                         f"reward.custom_reward_function.path={reward}")
    trainer = build_trainer(config, progress_bar=False)
    with pytest.raises(DynamicSamplingError, match=rf"step 1: 3 generation batches .* kept 0 of 6 groups whose '{metric}' "
                                                   r"varies, fewer than data.train_batch_size = 2"):
        trainer.fit()
    trainer.tracker.close()


def test_validation_scores_with_val_functions(tiny_config):
    """Training on a weighted sum, validating on accuracy alone (correctness at weight 0.5 is 0/1)."""
    config = tiny_config("reward.functions=[{name: correctness, weight: 1.0}, {name: mark, weight: 1.0}]",
                         "reward.val_functions=[{name: correctness, weight: 0.5}]", "trainer.total_training_steps=1",
                         custom_reward=False)
    trainer = build_trainer(config, progress_bar=False)
    trainer.tracker.close()
    assert [f.name for f in trainer.val_reward_fn.config.functions] == ["correctness"]
    assert [f.name for f in trainer.reward_fn.config.functions] == ["correctness", "mark"]


def test_gradient_checkpointing_trains_the_same_weights(tiny_config, tmp_path):
    weights = {}
    for on in (False, True):
        config = tiny_config(f"actor_rollout_ref.model.enable_gradient_checkpointing={on}", "trainer.total_training_steps=1",
                             "trainer.val_before_train=false", "data.val_files=[]",
                             f"trainer.default_local_dir={tmp_path / str(on)}")
        trainer, _, changed = run(config)
        assert changed and trainer.wg.worker.model.is_gradient_checkpointing is on
        weights[on] = [p.detach().clone() for p in trainer.wg.worker.model.parameters()]
    for a, b in zip(weights[False], weights[True]):
        assert torch.allclose(a, b, atol=1e-6)


def test_rollout_in_waves_of_max_num_seqs_trains_like_one_wave(tiny_config, tmp_path):
    """rollout.max_num_seqs reaches the engine of a real run: 2 rows at a time (the tiny config's
    groups are cut in waves) sample the same responses as one wave, so the step trains the same
    weights and logs the same response lengths."""
    results = {}
    for max_num_seqs in (1024, 2):
        config = tiny_config(f"actor_rollout_ref.rollout.max_num_seqs={max_num_seqs}", "trainer.total_training_steps=1",
                             "trainer.val_before_train=false", "data.val_files=[]",
                             "actor_rollout_ref.rollout.stop=[r]",  # rows end at different lengths
                             f"trainer.default_local_dir={tmp_path / str(max_num_seqs)}")
        trainer, _, changed = run(config)
        assert changed and trainer.wg.worker.rollout.config.max_num_seqs == max_num_seqs
        results[max_num_seqs] = ([p.detach().clone() for p in trainer.wg.worker.model.parameters()],
                                 read_metrics(config)[-1])
    (weights, metrics), (wave_weights, wave_metrics) = results[1024], results[2]
    assert metrics["response_length/min"] < metrics["response_length/max"]
    for key in ("response_length/mean", "response_length/min", "response_length/max", "critic/score/mean"):
        assert wave_metrics[key] == metrics[key], key
    for a, b in zip(weights, wave_weights):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_long_validation_batch_shows_its_time_passing(capsys):
    """One batch (the default job's validation: 40-50 s) would leave the bar still until the end:
    while it generates, the bar says so and its elapsed time is redrawn every second."""
    import time

    from tqdm import tqdm

    from rlvr.trainer.evaluate import ticking

    bar = tqdm(total=4, desc="validation", unit="prompt")
    bar.set_postfix_str("generating", refresh=False)
    with ticking(bar, every_s=0.2):
        time.sleep(1.1)  # a batch generating
    bar.close()
    err = capsys.readouterr().err
    # redrawn while it generated (about 5 times), not only when it was created and closed
    assert "generating" in err and len(re.findall(r"0/4 \[00:0\d", err)) >= 4, err


NAN_ON_ODD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """NaN for an odd number of characters, else 1."""
    return float("nan") if len(solution_str) % 2 else 1.0
'''


def test_a_group_with_an_invalid_reward_is_left_out_of_the_update(tiny_config, tmp_path, capsys):
    """TRL 1.6's bug: NaN became 0 and got a real advantage. Here the valid samples all score 1, so a
    group that kept its NaN samples as any number would have a nonzero advantage and a gradient;
    dropped, every remaining group has zero advantage: no gradient at all (KL and entropy off)."""
    from tests.trainer.test_learning import records_of

    reward = tmp_path / "nan_reward.py"
    reward.write_text(NAN_ON_ODD)
    trainer = build_trainer(tiny_config(f"reward.custom_reward_function.path={reward}", "trainer.val_before_train=false",
                                        "data.val_files=[]", "actor_rollout_ref.actor.use_kl_loss=false",
                                        "actor_rollout_ref.actor.entropy_coeff=0", "trainer.logger=[console,jsonl]",
                                        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2"),
                            progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    records = records_of(trainer)
    assert sum(r["reward/num_invalid"] for r in records) > 0
    assert all(r["actor/grad_norm"] == 0.0 and r["actor/pg_loss"] == 0.0 for r in records)
    assert sum(r.get("training/dropped_groups", 0) for r in records) > 0
    first = records[0]
    assert first["reward/num_invalid"] == first["reward/num_invalid/arithmetic"]  # counted per data source
    out = capsys.readouterr().out
    assert f"invalid rewards {first['reward/num_invalid']:g}" in out and "dropped groups" in out  # on the console


NAN_AFTER_FLAG = '''
import os

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """The length's parity, or NaN for every sample once the flag file exists."""
    return float("nan") if os.path.exists(FLAG) else float(len(solution_str) % 2)
'''


def test_a_step_whose_every_group_is_dropped_leaves_the_weights_alone(tiny_config, tmp_path):
    """Step 1 learns (AdamW's moments are nonzero after it); every reward of step 2 is NaN, so
    every group is left out and no token carries loss: the weights after step 2 equal those after
    step 1. An AdamW step on the zero gradients would move them by its moments (and by weight
    decay, 0.01 here)."""
    flag = tmp_path / "all_nan"
    reward = tmp_path / "reward.py"
    reward.write_text(f"FLAG = {str(flag)!r}\n" + NAN_AFTER_FLAG)
    trainer = build_trainer(tiny_config(f"reward.custom_reward_function.path={reward}", "trainer.val_before_train=false",
                                        "data.val_files=[]", "actor_rollout_ref.actor.use_kl_loss=false",
                                        "actor_rollout_ref.actor.optim.weight_decay=0.01",
                                        "trainer.freshness_check_freq=-1", "trainer.total_training_steps=2"),
                            progress_bar=False)
    weights, commit = [], trainer._commit

    def recording(metrics):
        commit(metrics)
        weights.append([p.detach().clone() for p in trainer.wg.worker.model.parameters()])
        flag.touch()  # every later reward is NaN

    trainer._commit = recording
    trainer.fit()
    trainer.tracker.close()
    from tests.trainer.test_learning import records_of

    first, second = records_of(trainer)
    assert first["actor/grad_norm"] > 0 and second["actor/grad_norm"] == 0.0
    assert second["training/dropped_groups"] == 2  # both prompts' groups
    assert all(torch.equal(a, b) for a, b in zip(weights[0], weights[1]))


NAN_OR_PARITY = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """NaN when the length is a multiple of 3, else the length's parity: groups vary, some hold a NaN."""
    return float("nan") if len(solution_str) % 3 == 0 else float(len(solution_str) % 2)
'''


def test_dapo_never_keeps_a_group_with_an_invalid_reward(tiny_config, tmp_path):
    """Dynamic sampling: a group holding a NaN score is dropped like a group without signal, and
    the batches it keeps join without a stray mask."""
    reward = tmp_path / "nan_or_parity.py"
    reward.write_text(NAN_OR_PARITY)
    config = tiny_config("algorithm.filter_groups.enable=true", "data.gen_batch_size=2",
                         "algorithm.filter_groups.max_num_gen_batches=40", "trainer.total_training_steps=2",
                         "trainer.val_before_train=false", "data.val_files=[]",
                         f"reward.custom_reward_function.path={reward}", "reward.failure_score=-7")
    run(config)
    records = read_metrics(config)
    assert sum(r["reward/num_invalid"] for r in records) > 0
    for step in (1, 2):
        rows = [json.loads(line) for line in open(tmp_path / "run" / "rollouts" / f"{step}.jsonl")]
        assert len(rows) == 2 * 3 and {r["score"] for r in rows} <= {0.0, 1.0}  # no placeholder (-7) kept


@pytest.mark.parametrize("source, truth, shape", [
    ("openai/gsm8k", ["72"], "one answer"),        # str(["72"]) is "['72']": no answer ever equals it
    ("arithmetic", {"answer": "7"}, "one number"),
    ("arithmetic", float("nan"), "one number"),     # valid in JSONL, and equal to nothing
    ("arithmetic", "abc", "one number"),            # the scorer raises on it (as_number is None), at every step
    ("arithmetic_tool", "12 apples", "one number"),  # tool_answer scores with arithmetic's scorer
    ("countdown", "24", "a mapping with 'target' and 'numbers'"),
    ("countdown", {"target": "24 or so", "numbers": [4, 6]}, "a mapping with 'target' and 'numbers'"),  # int() raises
    ("HuggingFaceH4/MATH-500", "$", "one answer math-verify can parse"),  # parses to nothing: the scorer raises
])
def test_a_ground_truth_its_scorer_cannot_compare_is_refused_at_load(tmp_path, tokenizer, source, truth, shape):
    from rlvr.config.schema import RewardConfig
    from rlvr.data import RLHFDataset
    from rlvr.trainer.main import check_scorable

    good = {"data_source": source, "prompt": [{"role": "user", "content": "q"}],
            "reward_model": {"ground_truth": {"target": 24, "numbers": [4, 6]} if source == "countdown" else "7"}}
    bad = {**good, "reward_model": {"ground_truth": truth}}
    (tmp_path / "a.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    dataset = RLHFDataset(tmp_path / "a.jsonl", tokenizer)
    with pytest.raises(DatasetError, match=rf"a.jsonl, line 2 \(data.train_files\): key 'reward_model.ground_truth' is "
                                           rf".*compares each response against {shape}"):
        check_scorable(dataset, RewardConfig(), "data_source", "data.train_files")
    dataset.rows, dataset.origins = dataset.rows[:1], dataset.origins[:1]
    check_scorable(dataset, RewardConfig(), "data_source", "data.train_files")  # the good row passes


def test_a_parquet_row_whose_number_is_not_one_is_refused_at_load_with_its_row(tmp_path, tokenizer):
    """The arithmetic scorer raised on the ground truth "abc" at every step; the row is refused when
    the file loads, named by its row."""
    from rlvr.config.schema import RewardConfig
    from rlvr.data import RLHFDataset
    from rlvr.trainer.main import check_scorable

    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": "q"}],
             "reward_model": {"ground_truth": truth}} for truth in ("7", "abc")]
    dataset = RLHFDataset(write_parquet(rows, tmp_path / "a.parquet"), tokenizer)
    with pytest.raises(DatasetError, match=r"a.parquet, row 1 \(data.train_files\): key 'reward_model.ground_truth' is "
                                           r"'abc' \(str\), but the reward function 'arithmetic' .* one number"):
        check_scorable(dataset, RewardConfig(), "data_source", "data.train_files")


def test_a_row_naming_an_interaction_the_config_lacks_is_refused_at_load(tmp_path, tokenizer):
    """It stopped the run at its first rollout, a ValueError naming "sample 0" and no file."""
    from rlvr.data import RLHFDataset
    from rlvr.tools.interaction import interaction_names
    from rlvr.trainer.main import check_interaction_names

    path = tmp_path / "interactions.yaml"
    path.write_text("interaction:\n  - name: gsm8k\n    class_name: rlvr.tools.interaction.Gsm8kInteraction\n")
    names = interaction_names(str(path))
    assert names == ["gsm8k"]
    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": "q"}],
             "reward_model": {"ground_truth": "1"}, "extra_info": {"interaction_kwargs": {"name": name}}}
            for name in ("gsm8k", "gms8k")]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = RLHFDataset(tmp_path / "a.jsonl", tokenizer)
    with pytest.raises(DatasetError, match=r"a.jsonl, line 2 \(data.val_files\): .*names interaction 'gms8k'.*"
                                           r"\['gsm8k'\]"):
        check_interaction_names(dataset, names, "data.val_files")


def test_the_runs_ray_groups_are_each_released_once():
    """Ray keeps a group's placement groups after the run: fit releases each group once (views of one
    group share its pool), and in-process groups (no pool) are left alone."""
    from types import SimpleNamespace

    from rlvr.trainer.main import release_worker_groups

    killed = []
    pool, other = object(), object()

    def group(name, resource_pool):
        return SimpleNamespace(resource_pool=resource_pool, kill=lambda: killed.append(name))

    actor, critic_view, rollout = group("actor", pool), group("critic", pool), group("rollout", other)
    release_worker_groups(actor, critic_view, rollout, SimpleNamespace(), None)
    assert killed == ["actor", "rollout"]
