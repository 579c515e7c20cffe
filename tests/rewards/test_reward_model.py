"""Reward-model plumbing with a tiny randomly initialised classifier: shapes, the scored
token, micro-batching and padding."""

import pytest
import torch

from rlvr.config.schema import RewardModelConfig
from rlvr.data.dataset import left_pad
from rlvr.protocol import DataProto
from rlvr.rewards.reward_model import RewardModel


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("rm")
    LlamaForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def policy_batch(tokenizer, extra_left_pad: int = 0) -> DataProto:
    prompts = ["What is 2 + 2?", "Name a colour that is also a fruit, please."]
    responses = ["4", "Orange, the fruit and the colour."]
    p_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    r_ids = [tokenizer.encode(r, add_special_tokens=False) for r in responses]
    width = max(map(len, p_ids)) + extra_left_pad
    ids, mask, pos = left_pad(p_ids, tokenizer.pad_token_id, length=width)
    R = max(map(len, r_ids)) + 2  # right padding beyond the longest response
    resp = torch.full((2, R), tokenizer.pad_token_id)
    rmask = torch.zeros(2, R, dtype=torch.long)
    for i, r in enumerate(r_ids):
        resp[i, :len(r)], rmask[i, :len(r)] = torch.tensor(r), 1
    return DataProto.from_dict({"input_ids": torch.cat([ids, resp], 1), "attention_mask": torch.cat([mask, rmask], 1),
                                "responses": resp, "response_mask": rmask, "prompts": ids})


def direct_score(model, tokenizer, prompt, response):
    """The classifier on the unpadded templated conversation, through transformers' own pooling."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
                                         tokenize=False)
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        return float(model(input_ids=ids).logits[0, 0])


def test_scores_land_on_the_last_response_token(classifier_dir, tokenizer):
    rm = RewardModel(RewardModelConfig(enable=True, path=str(classifier_dir), micro_batch_size_per_gpu=1), tokenizer)
    data = policy_batch(tokenizer)
    scores = rm.compute_rm_score(data).batch["rm_scores"]
    assert scores.shape == data.batch["responses"].shape
    lengths = data.batch["response_mask"].sum(-1)
    for i in range(2):
        nonzero = scores[i].nonzero().flatten().tolist()
        assert nonzero == [int(lengths[i]) - 1]  # only the last valid response token
    expected = [direct_score(rm.model, tokenizer, "What is 2 + 2?", "4"),
                direct_score(rm.model, tokenizer, "Name a colour that is also a fruit, please.",
                             "Orange, the fruit and the colour.")]
    assert scores.sum(-1).tolist() == pytest.approx(expected, abs=1e-5)


def test_batching_and_padding_do_not_change_scores(classifier_dir, tokenizer):
    one = RewardModel(RewardModelConfig(enable=True, path=str(classifier_dir), micro_batch_size_per_gpu=1), tokenizer)
    many = RewardModel(RewardModelConfig(enable=True, path=str(classifier_dir), micro_batch_size_per_gpu=8), tokenizer)
    base = one.scores(policy_batch(tokenizer))
    assert torch.allclose(many.scores(policy_batch(tokenizer)), base, atol=1e-5)  # left-padded micro-batch of 2
    assert torch.allclose(many.scores(policy_batch(tokenizer, extra_left_pad=5)), base, atol=1e-5)


def test_missing_path_is_clear(tokenizer):
    from rlvr.rewards import RewardError

    with pytest.raises(RewardError, match="reward.reward_model.path"):
        RewardModel(RewardModelConfig(enable=True, path=None), tokenizer)


@pytest.mark.parametrize("add_rule_scores", [False, True])
def test_trainer_trains_on_the_weighted_rm_scores(classifier_dir, tiny_model_dir, tmp_path, add_rule_scores):
    """With reward.reward_model.enable the step's score is weight x rm score, as verl's reward managers
    return the model's scores alone; reward.reward_model.add_rule_scores=true adds the rule score.
    Failed before the fix (False): the rule score was always added."""
    from rlvr.config import load_config
    from rlvr.data.prepare import prepare_arithmetic
    from rlvr.trainer.main import build_trainer

    data = prepare_arithmetic(tmp_path / "data", train_size=4, test_size=2)
    config = load_config(None, [
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files=[{data['train']}]", "data.val_files=[]",
        "data.train_batch_size=2", "data.max_response_length=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.val_before_train=false", "trainer.logger=[]",
        f"trainer.default_local_dir={tmp_path / 'run'}", "reward.reward_model.enable=true",
        f"reward.reward_model.path={classifier_dir}", "reward.reward_model.weight=0.5",
        f"reward.reward_model.add_rule_scores={add_rule_scores}",
    ])
    trainer = build_trainer(config, progress_bar=False)
    seen = {}
    rm_compute, rule_compute = trainer.reward_model.compute_rm_score, trainer.reward_fn.compute

    def record(name, fn):
        def wrapped(data):
            seen[name] = out = fn(data)
            return out
        return wrapped

    trainer.reward_model.compute_rm_score = record("rm", rm_compute)
    trainer.reward_fn.compute = record("rule", rule_compute)
    trainer.global_step = 1
    metrics = trainer.train_step(next(iter(trainer.loader)))
    assert "timing_s/reward_model" in metrics
    rm = seen["rm"].batch["rm_scores"].sum(-1)
    rule = seen["rule"].token_level_scores.sum(-1)
    assert rm.abs().min() > 0
    expected = rule + 0.5 * rm if add_rule_scores else 0.5 * rm
    assert metrics["critic/score/mean"] == pytest.approx(float(expected.mean()), abs=1e-6)


ZERO_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0
'''


def rm_trainer(classifier_dir, tiny_model_dir, tmp_path, *overrides):
    """One step on 2 prompts x 3 samples, a rule reward of 0, the reward model at weight 0.5."""
    from rlvr.config import load_config
    from rlvr.data.prepare import prepare_arithmetic
    from rlvr.trainer.main import build_trainer

    data = prepare_arithmetic(tmp_path / "data", train_size=4, test_size=2)
    reward_file = tmp_path / "zero.py"
    reward_file.write_text(ZERO_REWARD)
    config = load_config(None, [
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files=[{data['train']}]", "data.val_files=[]",
        "data.train_batch_size=2", "data.max_response_length=4", "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=6",
        "trainer.val_before_train=false", "trainer.logger=[jsonl]", "trainer.total_training_steps=1",
        f"trainer.default_local_dir={tmp_path / 'run'}", "reward.reward_model.enable=true",
        f"reward.reward_model.path={classifier_dir}", "reward.reward_model.weight=0.5",
        f"reward.custom_reward_function.path={reward_file}", *overrides,
    ])
    trainer = build_trainer(config, progress_bar=False)
    # the classifier's scores, scripted: rows are prompt 0 x 3, prompt 1 x 3; sample 3 is NaN
    trainer.reward_model.scores = lambda data: torch.tensor([0.5, 0.1, -0.2, float("nan"), 0.3, 0.0])
    return trainer


def test_a_nan_reward_model_score_drops_its_group_as_a_nan_rule_score_does(classifier_dir, tiny_model_dir, tmp_path):
    """Failed before the fix: the NaN reached token_level_scores, every advantage of its group was
    NaN, and the step's gradient was skipped as non-finite; nothing counted it as invalid."""
    import json

    from rlvr.protocol import loss_mask

    trainer = rm_trainer(classifier_dir, tiny_model_dir, tmp_path)
    seen = {}
    update_actor = trainer.wg.update_actor

    def record(batch):
        seen["advantages"], seen["loss_mask"] = batch.batch["advantages"].clone(), loss_mask(batch).clone()
        return update_actor(batch)

    trainer.wg.update_actor = record
    trainer.fit()
    trainer.tracker.close()
    assert (seen["loss_mask"].sum(-1) > 0).tolist() == [True] * 3 + [False] * 3  # the NaN's whole group is out
    # group 0 scores 0.5 x (0.5, 0.1, -0.2) = 0.25, 0.05, -0.1: mean 0.2 / 3 = 0.066667; deviations 0.183333,
    # -0.016667, -0.166667; unbiased std sqrt((0.033611 + 0.000278 + 0.027778) / 2) = sqrt(0.030833) = 0.175594;
    # advantages 1.044074, -0.094916, -0.949158 (on every token of the response)
    torch.testing.assert_close(seen["advantages"][:3, 0], torch.tensor([1.044074, -0.094916, -0.949158]),
                               atol=1e-4, rtol=0)
    assert seen["advantages"][3:].abs().max() == 0 and torch.isfinite(seen["advantages"]).all()
    record = json.loads(open(tmp_path / "run" / "metrics.jsonl").readline())
    assert record["reward/num_invalid"] == 1.0 and record["reward/num_invalid/arithmetic"] == 1.0
    assert record["reward_model/num_invalid"] == 1.0 and record["training/dropped_groups"] == 1.0
    assert record["actor/grad_norm_nonfinite"] == 0.0


def test_a_nan_reward_model_score_stops_the_step_under_on_invalid_raise(classifier_dir, tiny_model_dir, tmp_path):
    from rlvr.rewards import RewardError

    trainer = rm_trainer(classifier_dir, tiny_model_dir, tmp_path, "reward.on_invalid=raise")
    with pytest.raises(RewardError, match=r"reward model's score for sample 3 \(data_source='arithmetic'.*is not a "
                                          r"number \(nan\)"):
        trainer.fit()
    trainer.tracker.close()


def test_the_model_alone_is_the_score_unless_rule_scores_are_added():
    """add_reward_model_scores on hand-made scores: two samples, rule scores 1.0 and NaN (sample 1 is
    invalid for the rule scorer), model scores 0.5 and -0.2 on each response's last token."""
    from rlvr.config.schema import RewardConfig
    from rlvr.rewards.manager import RewardResult, place_on_last_token
    from rlvr.rewards.reward_model import add_reward_model_scores

    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rule = RewardResult(place_on_last_token(torch.tensor([1.0, 0.0]), mask), {}, {"reward/num_invalid": 1.0,
                        "reward/num_invalid/a": 1.0}, torch.tensor([1.0, 0.0]), torch.tensor([False, True]))
    rm_scores = place_on_last_token(torch.tensor([0.5, -0.2]), mask)
    alone = add_reward_model_scores(rule, rm_scores, RewardConfig(reward_model=RewardModelConfig(weight=2.0)), ["a", "a"])
    # 2 x 0.5 = 1.0 and 2 x -0.2 = -0.4; the rule's NaN is not trained on, so nothing is dropped
    assert alone.token_level_scores.sum(-1).tolist() == pytest.approx([1.0, -0.4])
    assert alone.token_level_scores[0, 1] == pytest.approx(1.0)  # on the last valid token
    assert alone.scores.tolist() == pytest.approx([1.0, -0.4])
    assert alone.invalid.tolist() == [False, False] and alone.metrics["reward/num_invalid"] == 0.0
    assert "reward/num_invalid/a" not in alone.metrics
    added = add_reward_model_scores(rule, rm_scores, RewardConfig(
        reward_model=RewardModelConfig(weight=2.0, add_rule_scores=True)), ["a", "a"])
    # 1.0 + 2 x 0.5 = 2.0; sample 1's rule score is a placeholder (0.0), its group dropped: invalid
    assert added.token_level_scores.sum(-1).tolist() == pytest.approx([2.0, -0.4])
    assert added.invalid.tolist() == [False, True] and added.metrics["reward/num_invalid"] == 1.0


def test_a_classifier_without_a_score_head_is_refused_when_built(tmp_path, tokenizer):
    """Failed before the fix: a BERT classifier (its head is `classifier`, on the pooled first token)
    loaded, then failed at the first step with an AttributeError."""
    from transformers import BertConfig, BertForSequenceClassification

    from rlvr.rewards import RewardError

    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(RewardError, match=r"\(BertForSequenceClassification\) has no `score` head"):
        RewardModel(RewardModelConfig(enable=True, path=str(tmp_path)), tokenizer)


def test_the_response_is_read_whole_tool_output_included(classifier_dir, tokenizer):
    """verl's reward model reads the response by attention_mask: with tools, the calls' results too.
    Failed before the fix: decoded by response_mask, the tool output (mask 0) was cut out."""
    rm = RewardModel(RewardModelConfig(enable=True, path=str(classifier_dir)), tokenizer)
    data = policy_batch(tokenizer)
    data.batch["response_mask"][1, 1:3] = 0  # two tokens of the second response are a tool's output
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour that is also a fruit, please."},
                                          {"role": "assistant", "content": "Orange, the fruit and the colour."}],
                                         tokenize=False)
    assert rm._conversation_ids(data, 1) == tokenizer.encode(text, add_special_tokens=False)
