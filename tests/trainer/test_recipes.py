"""The shipped recipes next to grpo.yaml: seed 002's GSM8K trainer on the fixtures, and DAPO on
the built-in task."""

import json

import pytest

from rlvr.cli import main
from rlvr.config import load_config
from rlvr.data.io import read_rows
from rlvr.trainer.main import build_trainer

# Chinese GSM8K rows in the raw layout (question_zh-cn, answer_only); eight, so a batch of 8 fits
ZH_ROWS = [{"question": "q", "answer": f"#### {a}", "question_zh-cn": f"小明有{a}个苹果，又买了{b}个，再吃掉{b}个。还剩几个？",
            "answer_only": str(a)} for a, b in zip(range(3, 11), range(1, 9))]


def test_seed_002_recipe_on_the_gsm8k_fixtures(tmp_path, tiny_model_dir, capsys):
    src = tmp_path / "gsm8k_zh"
    src.mkdir()
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ZH_ROWS))
    out = tmp_path / "data"
    assert main(["prepare", "gsm8k", "--src", str(src), "--out", str(out), "--system-prompt", "think-answer-zh"]) == 0
    row = read_rows(out / "train.parquet")[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "<answer>" in row["prompt"][0]["content"]
    assert row["prompt"][1]["content"].startswith("小明有3个苹果")

    config = load_config("gsm8k_zh", [f"data.train_files=[{out / 'train.parquet'}]",
                                      f"data.val_files=[{out / 'test.parquet'}]", f"actor_rollout_ref.model.path={tiny_model_dir}",
                                      "data.max_response_length=8", "trainer.total_training_steps=1", "trainer.logger=[jsonl]",
                                      f"trainer.default_local_dir={tmp_path / 'run'}"])
    rollout, actor = config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor
    assert (rollout.n, rollout.temperature, rollout.top_k) == (4, 0.9, 50)
    assert actor.loss_agg_mode == "seq-mean-token-mean" and not actor.use_kl_loss
    trainer = build_trainer(config, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [0, 1]
    for name in ("correctness", "digit", "hard_format", "mark"):
        assert f"reward/{name}/mean" in records[1], name  # each weighted function logged on its own
    assert 0.0 <= records[1]["val-core/openai/gsm8k/reward/mean@1"] <= 1.0
    assert trainer.wg.worker.ref is None  # no KL: no reference policy

    # validation is the accuracy, training the weighted sum: a perfect answer scores 1.0 and 3.5
    from rlvr.protocol import DataProto
    import torch
    text = "<think>3+1-1=3</think><answer>3</answer>"
    ids = torch.tensor([trainer.tokenizer.encode(text, add_special_tokens=False)])
    perfect = DataProto.from_dict({"responses": ids, "response_mask": torch.ones_like(ids)},
                                  {"data_source": ["openai/gsm8k"], "reward_model": [{"ground_truth": "3"}]})
    assert trainer.val_reward_fn(perfect).token_level_scores.sum().item() == 1.0
    assert trainer.reward_fn(perfect).token_level_scores.sum().item() == pytest.approx(2.0 + 0.5 + 0.5 + 0.5)


@pytest.mark.slow
def test_dapo_recipe_runs_on_the_builtin_task(tmp_path):
    from rlvr.data.prepare import prepare_arithmetic

    paths = prepare_arithmetic(tmp_path / "data", train_size=48, test_size=8)
    run_dir = tmp_path / "run"
    assert main(["train", "--config", "dapo", f"data.train_files=[{paths['train']}]", f"data.val_files=[{paths['test']}]",
                 "data.train_batch_size=4", "data.gen_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "actor_rollout_ref.rollout.n=4", "trainer.total_training_steps=2", "trainer.val_before_train=false",
                 f"trainer.default_local_dir={run_dir}"]) == 0
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["dapo/kept_groups"] >= 4 and "dapo/filtered_groups" in r and "reward/overlong_ratio" in r
        assert "actor/kl_loss" not in r
    for step in (1, 2):  # each step trains on exactly 4 groups of 4, none with one score for all
        rows = [json.loads(line) for line in open(run_dir / "rollouts" / f"{step}.jsonl")]
        assert len(rows) == 16 and len({r["uid"] for r in rows}) == 4
        for uid in {r["uid"] for r in rows}:
            assert len({r["score"] for r in rows if r["uid"] == uid}) > 1


def test_distill_recipe_trains_a_student_from_a_checkpoint(tmp_path, tiny_model_dir):
    """``--config distill``: a teacher from a run's checkpoint folder (here the tiny model's first
    step), its top-32 forward KL beside the task reward's GRPO loss, 16 prompts a step in two
    optimizer steps, no KL to the initial model; a missing teacher says how to get one."""
    from rlvr.config import ConfigError
    from rlvr.data.prepare import prepare_arithmetic

    paths = prepare_arithmetic(tmp_path / "data", train_size=16, test_size=4)
    common = [f"data.train_files=[{paths['train']}]", "data.val_files=[]", f"actor_rollout_ref.model.path={tiny_model_dir}",
              "data.max_response_length=8", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
              "trainer.total_training_steps=1", "trainer.logger=[jsonl]", "trainer.val_before_train=false"]
    with pytest.raises(ConfigError, match="arithmetic_grpo/checkpoints/global_step_24/actor' does not exist: train the teacher"):
        load_config("distill", common)
    teacher_run = tmp_path / "teacher"
    build = build_trainer(load_config(None, common + ["trainer.save_freq=1", f"trainer.default_local_dir={teacher_run}"]),
                          progress_bar=False)
    build.fit()
    build.tracker.close()
    config = load_config("distill", common + [f"trainer.default_local_dir={tmp_path / 'student'}",
                                              "distillation.teacher_models.teacher_model.model_path="
                                              f"{teacher_run / 'checkpoints' / 'global_step_1' / 'actor'}"])
    d = config.distillation
    assert d.enabled and d.distillation_loss.loss_mode == "forward_kl_topk" and d.distillation_loss.topk == 32
    assert d.distillation_loss.use_task_rewards and not config.actor_rollout_ref.actor.use_kl_loss
    recipe = load_config("distill", [f"distillation.teacher_models.teacher_model.model_path={tiny_model_dir}"])
    assert (recipe.data.train_batch_size, recipe.actor_rollout_ref.actor.ppo_mini_batch_size) == (16, 8)
    trainer = build_trainer(config, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    (record,) = [json.loads(line) for line in open(tmp_path / "student" / "metrics.jsonl")]
    # the teacher is the student one update on: near, not equal; the random tiny model's top 32 of
    # 49,152 tokens hold a little more than 32 / 49152 = 6.5e-4 of its mass
    assert 0.0 < record["actor/distillation/loss"] < 1e-3
    assert 6.5e-4 < record["actor/distillation/teacher_mass"] < 0.01
