"""How the manager calls a reward function and what it takes back: verl's keyword call, the
trainer's working directory kept, what registration accepts, and returns that are no numbers."""

import functools
import os

import pytest

from rlvr.config.schema import CustomRewardFunctionConfig, RewardConfig
from tests.rewards.batches import response_batch
from rlvr.rewards import RewardError, RewardManager, register_reward_fn
from rlvr.rewards.scorers import gsm8k


def batch(tokenizer, texts, truths=None):
    return response_batch(tokenizer, texts, truths=truths, extra_info=True)


def custom(tmp_path, source: str, **config) -> RewardConfig:
    path = tmp_path / "reward.py"
    path.write_text(source)
    return RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(path)), **config)


def test_a_function_with_verls_keyword_names_in_another_order_gets_the_right_arguments(tmp_path, tokenizer):
    """verl calls compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...).
    Failed before the fix: called positionally, this function got the data source as solution_str and
    the response as ground_truth, so the right answer "12" scored 0."""
    cfg = custom(tmp_path, "def compute_score(solution_str, ground_truth, data_source=None, extra_info=None):\n"
                           "    assert data_source == 'x' and extra_info['index'] in (0, 1)\n"
                           "    return float(solution_str == ground_truth)\n")
    result = RewardManager(tokenizer, cfg).compute(batch(tokenizer, ["12", "13"], ["12", "12"]))
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 0.0]
    assert result.metrics["reward/num_errors"] == 0.0


def test_a_function_that_changes_directory_leaves_the_trainers_where_it_was(tmp_path, tokenizer, monkeypatch):
    """Failed before the fix: os.chdir in the function moved the trainer's working directory for the
    rest of the run, and its relative run paths (runs/...) with it."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    cfg = custom(tmp_path, "import os\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                           "    os.chdir('/')\n    return 1.0\n")
    result = RewardManager(tokenizer, cfg).compute(batch(tokenizer, ["a", "b"]))
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 1.0]
    assert os.getcwd() == str(home)


def _make_scorer(bonus):
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 + bonus
    return scorer


@pytest.mark.parametrize("fn", [
    functools.partial(gsm8k.compute_score, method="flexible"),
    lambda data_source, solution_str, ground_truth, extra_info=None: 1.0,
    _make_scorer(0.5),
], ids=["partial", "lambda", "closure"])
def test_registering_what_a_scoring_process_cannot_find_again_is_refused(fn):
    """Failed before the fix: registration took them; then a partial crashed the manager with a bare
    AttributeError (no __qualname__), and a lambda or closure failed every sample."""
    with pytest.raises(TypeError, match=r"register_reward_fn\('test_unfindable'\) needs a function defined with def "
                                        r"at the top level of a module"):
        register_reward_fn("test_unfindable", ["test_unfindable_source"])(fn)


RETURNS = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"text": "0.75", "huge": 10 ** 400, "dict_text": {"score": "1"}}.get(solution_str, 1.0)
'''


def test_a_string_or_an_int_beyond_float_is_no_score(tmp_path, tokenizer):
    """A string is not a score, even one that reads as a number; 10**400 does not fit a float.
    Failed before the fix: "0.75" was trained on as 0.75, and 10**400 raised OverflowError, counted as
    an error and given reward.failure_score, which was trained on. Both are now invalid, as NaN is:
    counted, their groups left out of the update."""
    cfg = custom(tmp_path, RETURNS, failure_score=-1.0)
    result = RewardManager(tokenizer, cfg).compute(batch(tokenizer, ["ok", "text", "huge", "dict_text"]))
    assert result.invalid.tolist() == [False, True, True, True]
    assert result.metrics["reward/num_invalid"] == 3.0 and result.metrics["reward/num_errors"] == 0.0
    with pytest.raises(RewardError, match=r"sample 1 .*reward function 'compute_score' returned the string '0.75', "
                                          r"not a number"):
        RewardManager(tokenizer, custom(tmp_path, RETURNS, on_invalid="raise")).compute(batch(tokenizer, ["ok", "text"]))
    with pytest.raises(RewardError, match=r"sample 1 .*reward function 'compute_score' returned an int too large "
                                          r"for a float"):
        RewardManager(tokenizer, custom(tmp_path, RETURNS, on_invalid="raise")).compute(batch(tokenizer, ["ok", "huge"]))
