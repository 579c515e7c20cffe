import numpy as np
import pytest
import torch

from rlvr.config.schema import CustomRewardFunctionConfig, RewardConfig, RewardFunctionEntry
from rlvr.protocol import DataProto
from tests.rewards.batches import response_batch
from rlvr.rewards import RewardError, RewardManager, place_on_last_token
from rlvr.rewards.scorers import countdown, gsm8k, math


def batch(tokenizer, texts, sources, truths):
    return response_batch(tokenizer, texts, sources, truths, extra_info=True)


def test_place_on_last_token():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # scores land on the last valid token: index 1 in row 0, index 2 in row 1
    assert place_on_last_token(torch.tensor([2.0, 3.0]), mask).tolist() == [[0, 2, 0], [0, 0, 3]]


def test_gsm8k_strict_and_flexible():
    assert gsm8k.compute_score("gsm8k", "so it is 1,234.\n#### 1,234", "1234") == 1.0
    assert gsm8k.compute_score("gsm8k", "#### -8", "-8") == 1.0
    assert gsm8k.compute_score("gsm8k", "the answer is 72", "72") == 0.0  # strict needs ####
    assert gsm8k.compute_score_flexible("gsm8k", "the answer is $72.", "72") == 1.0
    assert gsm8k.compute_score_flexible("gsm8k", "3.5 then 2.50", "2.5") == 1.0


def test_math_verify_scorer():
    assert math.compute_score("math", "so $\\boxed{\\frac{1}{2}}$", "0.5")["score"] == 1.0
    assert math.compute_score("math", "so $\\boxed{3}$", "\\frac{1}{2}")["score"] == 0.0


def test_countdown_scorer():
    gt = {"target": 10, "numbers": [2, 3, 4]}
    assert countdown.compute_score("countdown", "<answer>2 * 3 + 4</answer>", gt)["score"] == 1.0
    assert countdown.compute_score("countdown", "<answer>2 + 3 + 4</answer>", gt)["score"] == 0.1
    assert countdown.compute_score("countdown", "no answer", gt)["score"] == 0.0


def test_manager_by_data_source(tokenizer):
    data = batch(tokenizer, ["7 + 5 = 12", "#### 9", "wrong 3"], ["arithmetic", "openai/gsm8k", "arithmetic"],
                 ["12", "9", "4"])
    result = RewardManager(tokenizer).compute(data)
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 1.0, 0.0]
    assert result.metrics["reward/num_errors"] == 0.0


def test_weighted_functions(tokenizer):
    cfg = RewardConfig(functions=[RewardFunctionEntry("correctness", 1.0), RewardFunctionEntry("hard_format", 2.0)])
    data = batch(tokenizer, ["<think>x</think><answer>5</answer>"], ["anything"], ["5"])
    result = RewardManager(tokenizer, cfg).compute(data)
    # correctness 2.0 * 1 + hard_format 0.5 * 2 = 3.0; each function logged on its own
    assert result.token_level_scores.sum().item() == pytest.approx(3.0)
    assert result.metrics["reward/correctness/mean"] == 2.0 and result.metrics["reward/hard_format/mean"] == 0.5


def test_custom_function_and_failures(tmp_path, tokenizer):
    f = tmp_path / "my_reward.py"
    f.write_text("import time\n"
                 "def score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
                 "    if 'boom' in solution_str: raise ValueError('bad sample')\n"
                 "    if 'slow' in solution_str: time.sleep(5)\n"
                 "    return {'score': 1.0 + bonus, 'length': len(solution_str)}\n")
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(f), "score", {"bonus": 0.5}),
                       timeout_s=0.5, failure_score=-1.0)
    data = batch(tokenizer, ["fine", "boom", "slow"], ["x"] * 3, ["1"] * 3)
    result = RewardManager(tokenizer, cfg).compute(data)
    assert result.token_level_scores.sum(-1).tolist() == [1.5, -1.0, -1.0]
    assert result.metrics["reward/num_errors"] == 1.0 and result.metrics["reward/num_timeouts"] == 1.0
    with pytest.raises(RewardError, match="sample 1"):
        RewardManager(tokenizer, RewardConfig(custom_reward_function=cfg.custom_reward_function,
                                              on_error="raise")).compute(data[:2])
    with pytest.raises(RewardError, match="has no function 'nope'.*'score'"):
        RewardManager(tokenizer, RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(f), "nope")))
    with pytest.raises(RewardError, match="does not exist"):
        RewardManager(tokenizer, RewardConfig(custom_reward_function=CustomRewardFunctionConfig("/no.py", "f")))


def test_unknown_data_source_is_clear(tokenizer):
    with pytest.raises(KeyError, match="no reward function for data_source 'mystery'"):
        RewardManager(tokenizer).compute(batch(tokenizer, ["1"], ["mystery"], ["1"]))


def test_process_pool_matches_serial(tokenizer):
    data = batch(tokenizer, ["7 + 5 = 12", "#### 9", "wrong 3"] * 4, ["arithmetic", "gsm8k", "arithmetic"] * 4,
                 ["12", "9", "4"] * 4)
    serial = RewardManager(tokenizer).compute(data)
    pooled_manager = RewardManager(tokenizer, RewardConfig(num_workers=2))
    pooled = pooled_manager.submit(data).result()
    pooled_manager.close()
    assert torch.equal(serial.token_level_scores, pooled.token_level_scores)


NONFINITE = '''
import numpy as np

def score(data_source, solution_str, ground_truth, extra_info=None):
    return {"nan": float("nan"), "inf": float("inf"), "dict": {"score": float("-inf")}, "none": None,
            "np": np.float32("nan")}.get(solution_str, 1.0)
'''


def test_scores_that_are_not_numbers_are_counted_and_flagged_never_scored(tmp_path, tokenizer):
    """NaN, inf, None (numpy's NaN too) are not given reward.failure_score as a real score: each is
    flagged invalid (its group is then dropped from the update) and counted per data source."""
    f = tmp_path / "nonfinite.py"
    f.write_text(NONFINITE)
    custom = CustomRewardFunctionConfig(str(f), "score")
    data = batch(tokenizer, ["ok", "nan", "inf", "dict", "none", "np"], ["a", "a", "b", "b", "b", "a"], ["1"] * 6)
    result = RewardManager(tokenizer, RewardConfig(custom_reward_function=custom, failure_score=-0.5)).compute(data)
    assert result.invalid.tolist() == [False, True, True, True, True, True]
    assert result.metrics["reward/num_invalid"] == 5.0 and result.metrics["reward/num_errors"] == 0.0
    assert result.metrics["reward/num_invalid/a"] == 2.0 and result.metrics["reward/num_invalid/b"] == 3.0
    assert result.token_level_scores.sum(-1).isfinite().all()  # placeholders, never NaN in the batch
    with pytest.raises(RewardError, match=r"sample 1 .*is not a number: reward function .* returned nan"):
        RewardManager(tokenizer, RewardConfig(custom_reward_function=custom, on_invalid="raise")).compute(data)


def test_a_batch_where_every_reward_failed_stops_the_run(tokenizer):
    # rows without reward_model.ground_truth: the arithmetic scorer fails on every sample
    data = batch(tokenizer, ["1", "2"], ["arithmetic"] * 2, [None, None])
    with pytest.raises(RewardError, match=r"2 of 2 samples failed to score .*max_failed_fraction=0.99.*the first: "
                                          r"reward for sample 0"):
        RewardManager(tokenizer).compute(data)
    # a higher threshold lets the run go on (and count the failures)
    result = RewardManager(tokenizer, RewardConfig(max_failed_fraction=1.0)).compute(data)
    assert result.metrics["reward/num_errors"] == 2.0


@pytest.mark.parametrize("workers", [0, 1])
def test_no_time_limit_means_no_limit_inline_and_in_the_pool(tmp_path, tokenizer, workers):
    """timeout_s=null: a 1.5 s scorer is not cut off, and the pool does not give the batch 10 s."""
    f = tmp_path / "slow.py"
    f.write_text("import time\ndef score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    time.sleep(1.5)\n    return 1.0\n")
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(f), "score"), timeout_s=None,
                       num_workers=workers)
    manager = RewardManager(tokenizer, cfg)
    result = manager.compute(batch(tokenizer, ["a"], ["x"], ["1"]))
    manager.close()
    assert result.token_level_scores.sum().item() == 1.0 and result.metrics["reward/num_timeouts"] == 0.0


def test_overlong_shaping_penalises_the_last_buffer_tokens(tmp_path, tokenizer):
    from rlvr.config.schema import OverlongBufferConfig

    f = tmp_path / "one.py"
    f.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    data = batch(tokenizer, ["x"] * 4, ["x"] * 4, ["1"] * 4)
    lengths = [4, 6, 8, 10]  # max_response_length 10, buffer 4: the penalty starts after 6 tokens
    data.batch["responses"] = torch.full((4, 10), 5)
    data.batch["response_mask"] = (torch.arange(10)[None] < torch.tensor(lengths)[:, None]).long()
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(f), "score"),
                       overlong_buffer=OverlongBufferConfig(enable=True, len=4, penalty_factor=0.5))
    result = RewardManager(tokenizer, cfg, max_response_length=10).compute(data)
    # penalty = min(0, -(len - 6) / 4 * 0.5): 0, 0, -0.25, -0.5
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 1.0, 0.75, 0.5]
    assert result.scores.tolist() == [1.0] * 4  # before shaping: what dynamic sampling filters on
    assert result.token_level_scores[2, 7] == 0.75  # on the last valid token
    assert result.metrics["reward/overlong_ratio"] == 0.5


POOL_REWARD = '''
import signal, time

from rlvr.rewards.manager import TIMEOUT_SIGNAL

def score(data_source, solution_str, ground_truth, extra_info=None):
    if "stuck" in solution_str:  # like C code that never returns to Python: the per-sample timer cannot fire
        signal.pthread_sigmask(signal.SIG_BLOCK, {TIMEOUT_SIGNAL})
        time.sleep(30)
    if "slow" in solution_str:
        time.sleep(5)
    return 1.0
'''


def test_pool_timeout_and_stuck_worker_paths(tmp_path, tokenizer, monkeypatch):
    """In the pool, a slow sample times out on its own timer and the others keep their scores;
    a worker that ignores the timer is killed at the chunk deadline (its chunk counted as
    timeouts), and the pool is rebuilt for the next batch."""
    from rlvr.rewards import manager as manager_module

    monkeypatch.setattr(manager_module, "POOL_GRACE_S", 1.0)
    f = tmp_path / "pool_reward.py"
    f.write_text(POOL_REWARD)
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(f), "score"), timeout_s=0.5,
                       num_workers=1, failure_score=-1.0, max_failed_fraction=1.0)
    manager = RewardManager(tokenizer, cfg)
    try:
        slow = manager.compute(batch(tokenizer, ["fine", "slow", "fine"], ["x"] * 3, ["1"] * 3))
        assert slow.token_level_scores.sum(-1).tolist() == [1.0, -1.0, 1.0]
        assert slow.metrics["reward/num_timeouts"] == 1.0
        pool = manager._pool
        stuck = manager.compute(batch(tokenizer, ["stuck", "fine"], ["x"] * 2, ["1"] * 2))
        assert stuck.token_level_scores.sum(-1).tolist() == [-1.0, -1.0]  # one worker: both in the killed chunk
        assert stuck.metrics["reward/num_timeouts"] == 2.0
        assert manager._pool is None  # killed
        again = manager.compute(batch(tokenizer, ["fine"], ["x"], ["1"]))
        assert again.token_level_scores.sum().item() == 1.0 and manager._pool is not pool  # a new pool
    finally:
        manager.close()


CUSTOM_REWARD_MODULE = '''
from rlvr.rewards import register_reward_fn

@register_reward_fn("test_even_length", needs_ground_truth=False)
def even_length(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2 == 0)
'''


def test_a_reward_function_registered_by_custom_modules_scores_in_the_pool(tmp_path, tokenizer):
    from rlvr.config.loader import import_custom_modules

    module = tmp_path / "my_rewards.py"
    module.write_text(CUSTOM_REWARD_MODULE)
    import_custom_modules([str(module)])
    cfg = RewardConfig(functions=[RewardFunctionEntry("test_even_length", 1.0)], num_workers=1)
    data = batch(tokenizer, ["ab", "abc", "abcd"], ["x"] * 3, ["0"] * 3)
    manager = RewardManager(tokenizer, cfg)
    try:
        # the pool's processes never imported the file: they find it by the module name and file it had here
        result = manager.submit(data).result()
    finally:
        manager.close()
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert result.metrics["reward/num_errors"] == 0.0


def test_the_time_limit_holds_off_the_main_thread(tmp_path, tokenizer):
    """Scored from another thread (where the timer's signal cannot act), with num_workers=0: the manager scores
    in a one-process pool, whose timer acts, so a hanging scorer times out. Failed before the fix:
    the scorer ran its 5 s to the end and scored 1.0 (the timer was skipped off the main thread)."""
    import concurrent.futures

    f = tmp_path / "hangs.py"
    f.write_text("import time\ndef score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    if 'hang' in solution_str: time.sleep(5)\n    return 1.0\n")
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(f), "score"), timeout_s=0.3,
                       failure_score=-1.0)
    manager = RewardManager(tokenizer, cfg)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
        result = thread.submit(manager.compute, batch(tokenizer, ["fine", "hang"], ["x"] * 2, ["1"] * 2)).result()
    manager.close()
    assert result.token_level_scores.sum(-1).tolist() == [1.0, -1.0]
    assert result.metrics["reward/num_timeouts"] == 1.0
    assert manager.config.num_workers == 0  # the configuration is left as it was


def test_list_extras_of_equal_length_stay_one_entry_per_row(tmp_path, tokenizer):
    """Failed before the fix: three 2-item lists became a (3, 2) object array, which DataProto refused
    later in select_idxs (non-tensor keys must be 1-D)."""
    f = tmp_path / "lists.py"
    f.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    return {'score': 1.0, 'pred': [solution_str, ground_truth]}\n")
    data = batch(tokenizer, ["12", "13", "14"], ["x"] * 3, ["1"] * 3)
    result = RewardManager(tokenizer, RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(f), "score"))
                           ).compute(data)
    pred = result.reward_extra_info["pred"]
    assert pred.shape == (3,) and pred[1] == ["13", "1"]
    data.non_tensor_batch["pred"] = pred
    kept = data.select_idxs(np.array([True, False, True]))
    assert kept.non_tensor_batch["pred"].tolist() == [["12", "1"], ["14", "1"]]


@pytest.mark.parametrize("key", ["uid", "data_source", "score"])
def test_an_extra_named_like_a_batch_column_is_refused(tmp_path, tokenizer, monkeypatch, key):
    """Failed before the fix: a function returning {'score', 'uid': ...} replaced GRPO's group ids in
    the batch (every sample one group); 'data_source' replaced the rows' sources. 'score' is reserved
    too: reward.functions logs each function's value under the function's name."""
    from rlvr.rewards.registry import REWARD_FNS
    from rlvr.rewards.scorers import format

    f = tmp_path / "clash.py"
    f.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 f"    return {{'score': 1.0, {key!r}: 'mine'}}\n")
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(f), "score"))
    if key == "score":  # a dict's own "score" is its score: a function registered as "score" in a list is the clash
        monkeypatch.setitem(REWARD_FNS._entries, "score", format.mark)
        cfg = RewardConfig(functions=[RewardFunctionEntry("correctness"), RewardFunctionEntry("score")])
    data = batch(tokenizer, ["12", "13"], ["x"] * 2, ["1"] * 2)
    data.non_tensor_batch["uid"] = np.array(["g0", "g0"], dtype=object)
    with pytest.raises(RewardError, match=rf"reward function 'score' returned the extra value {key!r}, which is "
                                          rf"(a column of the batch|the score's own name)"):
        RewardManager(tokenizer, cfg).compute(data)
    assert data.non_tensor_batch["uid"].tolist() == ["g0", "g0"]


def test_an_agent_loops_bad_reward_score_is_named_without_extra_quotes():
    from rlvr.rewards.manager import given_score

    # the string "0.5" is described in prose, not wrapped as the repr of that prose
    assert given_score("0.5")["error"] == "the agent loop returned reward_score the string '0.5', not a number"
    assert given_score(None)["error"] == "the agent loop returned reward_score None"
    assert given_score(float("inf"))["error"] == "the agent loop returned reward_score inf"
    assert given_score(2.0) == {"status": "ok", "score": 2.0, "extras": {}}


def _sure(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "acc": 1.0}


def _unsure(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.0, "acc": 0.0}


def test_two_functions_returning_one_extra_key_keep_both(tokenizer, monkeypatch):
    """reward.functions whose functions both return 'acc': the second's replaced the first's in
    reward_extra_info and the metrics, silently. The first listed keeps the plain key (what DAPO's
    filter_groups.metric=acc reads), a later one's is named after its function."""
    from rlvr.rewards.registry import REWARD_FNS

    monkeypatch.setitem(REWARD_FNS._entries, "sure", _sure)
    monkeypatch.setitem(REWARD_FNS._entries, "unsure", _unsure)
    cfg = RewardConfig(functions=[RewardFunctionEntry("sure"), RewardFunctionEntry("unsure")])
    result = RewardManager(tokenizer, cfg).compute(batch(tokenizer, ["12", "13"], ["x"] * 2, ["1"] * 2))
    assert result.reward_extra_info["acc"].tolist() == [1.0, 1.0]
    assert result.reward_extra_info["unsure/acc"].tolist() == [0.0, 0.0]
    assert result.metrics["reward/acc/mean"] == 1.0 and result.metrics["reward/unsure/acc/mean"] == 0.0
