"""A reward function's worst endings are counted like its other failures, with the function and
the sample named: one that calls sys.exit(), one that returns a score too large for the
float32 the scores are kept in (issue 47, §2)."""

import pytest

from rlvr.config.schema import CustomRewardFunctionConfig, RewardConfig
from tests.rewards.batches import response_batch
from rlvr.rewards import RewardError, RewardManager

EXITING = '''
import sys

def score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "exit":
        sys.exit(3)
    if solution_str == "huge":
        return 1e300
    if solution_str == "large":
        return -1e20
    return 1.0
'''


def batch(tokenizer, texts):
    return response_batch(tokenizer, texts)


@pytest.fixture
def custom(tmp_path):
    path = tmp_path / "exiting.py"
    path.write_text(EXITING)
    return CustomRewardFunctionConfig(str(path), "score")


@pytest.mark.parametrize("workers", [0, 1])
def test_a_reward_function_that_calls_sys_exit_is_a_counted_error(tokenizer, custom, capsys, workers):
    """sys.exit() inside the reward function once ended the whole run with its code (3) and no
    message; it is the function failing on that sample: failure_score, counted, named."""
    manager = RewardManager(tokenizer, RewardConfig(custom_reward_function=custom, failure_score=-1.0,
                                                    num_workers=workers))
    result = manager.compute(batch(tokenizer, ["fine", "exit", "fine"]))
    manager.close()
    assert result.token_level_scores.sum(-1).tolist() == [1.0, -1.0, 1.0]
    assert result.metrics["reward/num_errors"] == 1.0
    err = capsys.readouterr().err
    assert "sample 1" in err and "reward function 'score' called sys.exit(3)" in err, err
    with pytest.raises(RewardError, match=r"sample 1 .*called sys\.exit\(3\)"):
        RewardManager(tokenizer, RewardConfig(custom_reward_function=custom, on_error="raise")).compute(
            batch(tokenizer, ["fine", "exit"]))


def test_a_score_beyond_what_float32_can_normalise_is_invalid(tokenizer, custom):
    """1e300 does not fit a float32 (max 3.4e38): it once ended the run in torch's 'value cannot
    be converted to type float without overflow'. -1e20 fits, but a group's variance squares it
    (1e40 > 3.4e38): the std is inf and every advantage of the group silently 0. Scores beyond
    sqrt(3.4e38) = 1.8e19 are invalid, as NaN is: counted, their groups left out of the update."""
    cfg = RewardConfig(custom_reward_function=custom, failure_score=0.0)
    result = RewardManager(tokenizer, cfg).compute(batch(tokenizer, ["fine", "huge", "large"]))
    assert result.invalid.tolist() == [False, True, True]
    assert result.metrics["reward/num_invalid"] == 2.0
    with pytest.raises(RewardError, match=r"sample 1 .*returned 1e\+300, beyond"):
        RewardManager(tokenizer, RewardConfig(custom_reward_function=custom, on_invalid="raise")).compute(
            batch(tokenizer, ["fine", "huge"]))
