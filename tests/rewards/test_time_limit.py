"""The per-sample time limit holds whatever the reward function does with signals, and a slow
import of the function's file is not charged to any sample."""

import pytest

from rlvr.config.schema import CustomRewardFunctionConfig, RewardConfig
from tests.rewards.batches import response_batch
from rlvr.rewards import RewardManager


def batch(tokenizer, texts):
    return response_batch(tokenizer, texts)


CLEARS_THE_ALARM = '''
import signal, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "alarm0":
        signal.alarm(0)          # what a library's own timeout does when it is done
    if solution_str == "math_verify":
        from math_verify import parse
        parse("$1 + 1$")         # math-verify's default parsing_timeout: a SIGALRM timer of its own
    time.sleep(3)                # then something slow
    return 1.0
'''


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("text", ["alarm0", "math_verify"])
def test_a_function_that_clears_the_alarm_is_still_stopped(tmp_path, tokenizer, text, workers):
    """Failed before the fix: the limit was SIGALRM's timer, which signal.alarm(0) (and math-verify's
    parse, on its way out) clears, so the 3 s sleep ran to the end and scored 1.0."""
    path = tmp_path / "clears.py"
    path.write_text(CLEARS_THE_ALARM)
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(path)), timeout_s=0.5,
                       failure_score=-1.0, max_failed_fraction=1.0, num_workers=workers)
    manager = RewardManager(tokenizer, cfg)
    try:
        result = manager.compute(batch(tokenizer, [text]))
    finally:
        manager.close()
    assert result.token_level_scores.sum().item() == -1.0
    assert result.metrics["reward/num_timeouts"] == 1.0


SLOW_IMPORT = '''
import time
time.sleep(2.0)  # a heavy import: a model, sympy, a tokenizer

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
'''


def test_a_slow_import_is_not_charged_to_the_first_sample_in_the_pool(tmp_path, tokenizer):
    """Failed before the fix: each scoring process imported the file inside its first sample's
    1 s limit; the interrupted import was undone, so every sample timed out, step after step."""
    path = tmp_path / "slow_import.py"
    path.write_text(SLOW_IMPORT)
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(path)), timeout_s=1.0,
                       failure_score=-1.0, max_failed_fraction=1.0, num_workers=1)
    manager = RewardManager(tokenizer, cfg)
    try:
        first = manager.compute(batch(tokenizer, ["a", "b"]))
        second = manager.compute(batch(tokenizer, ["c"]))
    finally:
        manager.close()
    assert first.token_level_scores.sum(-1).tolist() == [1.0, 1.0] and first.metrics["reward/num_timeouts"] == 0.0
    assert second.token_level_scores.sum().item() == 1.0


BUSY = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    end = time.perf_counter() + float(solution_str)
    while time.perf_counter() < end:  # Python code: the limit can stop it between any two lines
        pass
    return 1.0
'''


def test_limits_that_pass_as_the_call_returns_leave_the_process_as_it_was(tmp_path):
    """300 calls of 0-4 ms under a 2 ms limit: many end near their limit, where the signal may arrive
    after the call returned. Each is scored or timed out, never killed (the signal's default action
    ends the process) and never charged to the next call; the signal's handler is put back."""
    import random
    import signal

    from rlvr.rewards.manager import TIMEOUT_SIGNAL, FnRef, load_function, score_sample

    path = tmp_path / "busy.py"
    path.write_text(BUSY)
    load_function(str(path), "compute_score")
    fns = ((FnRef("compute_score", path=str(path)), 1.0),)
    before = signal.getsignal(TIMEOUT_SIGNAL)
    rng = random.Random(0)
    statuses = [score_sample(fns, "x", str(rng.uniform(0, 0.004)), "1", None, 0.002)["status"] for _ in range(300)]
    assert set(statuses) <= {"ok", "timeout"} and "timeout" in statuses
    assert signal.getsignal(TIMEOUT_SIGNAL) is before


def test_without_posix_timers_the_limit_is_sigalrms(tmp_path, tokenizer, monkeypatch):
    """Where timer_create is missing (not Linux), the limit falls back to SIGALRM's timer."""
    from rlvr.rewards import manager

    def missing():
        raise AttributeError("timer_create")

    monkeypatch.setattr(manager, "_KernelTimer", missing)
    monkeypatch.setattr(manager, "_TIMER", None)
    path = tmp_path / "sleeps.py"
    path.write_text("import time\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    time.sleep(3)\n    return 1.0\n")
    cfg = RewardConfig(custom_reward_function=CustomRewardFunctionConfig(str(path)), timeout_s=0.3,
                       failure_score=-1.0, max_failed_fraction=1.0)
    result = RewardManager(tokenizer, cfg).compute(batch(tokenizer, ["a"]))
    assert result.metrics["reward/num_timeouts"] == 1.0
    assert isinstance(manager._TIMER, manager._AlarmTimer)
