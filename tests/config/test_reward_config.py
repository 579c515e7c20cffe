"""Reward settings are read, or refused at load with the key and the fix: verl's
custom_reward_function.reward_kwargs, a custom function that is not there, settings that would
be ignored or fail only at the first step."""

import pytest

from rlvr.config import ConfigError, load_config

SCORER = "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n    return 1.0\n"


@pytest.fixture
def scorer(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(SCORER)
    return path


def test_verls_reward_kwargs_in_a_yaml_are_the_scorers_keyword_arguments(tmp_path, scorer):
    """Failed before the fix: a dict value was skipped by the alias, and the section refused as an
    unknown key ('custom_reward_function')."""
    f = tmp_path / "verl.yaml"
    f.write_text(f"defaults:\n  - ppo_trainer\n  - _self_\ncustom_reward_function:\n  path: {scorer}\n"
                 "  name: compute_score\n  reward_kwargs:\n    bonus: 0.5\n")
    custom = load_config(f).reward.custom_reward_function
    assert (custom.path, custom.name, custom.reward_kwargs) == (str(scorer), "compute_score", {"bonus": 0.5})


@pytest.mark.parametrize("override", ["custom_reward_function.reward_kwargs.bonus=0.5",
                                      "+custom_reward_function.reward_kwargs.bonus=0.5",
                                      "custom_reward_function.reward_kwargs={bonus: 0.5}"])
def test_verls_reward_kwargs_on_the_command_line(scorer, override):
    cfg = load_config("verl", [f"custom_reward_function.path={scorer}", override])
    assert cfg.reward.custom_reward_function.reward_kwargs == {"bonus": 0.5}


def test_both_spellings_of_reward_kwargs_must_agree(scorer):
    with pytest.raises(ConfigError, match=r"custom_reward_function.reward_kwargs=\{'bonus': 0.5\} and "
                                          r"reward.custom_reward_function.reward_kwargs=\{'bonus': 1\}.*keep one"):
        load_config(None, [f"reward.custom_reward_function.path={scorer}", "custom_reward_function.reward_kwargs.bonus=0.5",
                           "reward.custom_reward_function.reward_kwargs.bonus=1"])


@pytest.mark.parametrize("override, message", [
    ("reward.custom_reward_function.reward_kwargs.bonus=1",
     r"reward.custom_reward_function.reward_kwargs = \{'bonus': 1\} is passed to a custom reward function, and "
     r"reward.custom_reward_function.path is not set"),
    ("reward.custom_reward_function.name=my_fn",
     r"reward.custom_reward_function.name = 'my_fn' is the function in reward.custom_reward_function.path, "
     r"which is not set"),
    ("reward.num_workers=-3", r"reward.num_workers = -3 must be >= 0"),
    ("reward.reward_model.micro_batch_size_per_gpu=0", r"reward.reward_model.micro_batch_size_per_gpu = 0 must be >= 1"),
    ("reward.failure_score=1e30", r"reward.failure_score = 1e\+30 must be a number within ±1.8e\+19"),
    ("reward.failure_score=.nan", r"reward.failure_score = nan: must be a finite number"),
    ("reward.failure_score=-.inf", r"reward.failure_score = -inf: must be a finite number"),
    ("reward.functions=[{name: gsm8k, weight: .nan}]", r"reward.functions\[0\].weight = nan: must be a finite number"),
    ("reward.reward_model.weight=.inf", r"reward.reward_model.weight = inf: must be a finite number"),
])
def test_reward_settings_that_would_be_ignored_or_fail_late_are_refused(override, message):
    """Each loaded before the fix: ignored (reward_kwargs, name without a path), or failing only at
    the first step (micro-batch 0), or scoring every sample as NaN (a NaN weight). Each bad value is
    named once, not once by the reward check and again by the check of every float."""
    with pytest.raises(ConfigError, match=message) as err:
        load_config(None, [override])
    key = message.split(" = ")[0].replace("\\", "")  # the key the message names, unescaped
    assert str(err.value).count(f"{key} =") == 1  # named once: not by its own check and again by every float's


def test_a_custom_reward_file_is_checked_at_load(tmp_path, scorer):
    """Failed before the fix: a missing file or a wrong name was reported only when the reward manager
    was built, after the models had loaded."""
    with pytest.raises(ConfigError, match=r"reward.custom_reward_function.path = '.*nope.py' does not exist"):
        load_config(None, [f"reward.custom_reward_function.path={tmp_path / 'nope.py'}"])
    with pytest.raises(ConfigError, match=r"reward.custom_reward_function.name = 'score': .*my_reward.py' defines no "
                                          r"'score' at its top level; it defines \['compute_score'\]"):
        load_config(None, [f"reward.custom_reward_function.path={scorer}", "reward.custom_reward_function.name=score"])
    broken = tmp_path / "broken.py"
    broken.write_text("def compute_score(:\n")
    with pytest.raises(ConfigError, match=r"reward.custom_reward_function.path = '.*broken.py' is not valid Python: "
                                          r".*line 1"):
        load_config(None, [f"reward.custom_reward_function.path={broken}"])
    imported = tmp_path / "imported.py"  # a name bound by an import or an assignment is a name too
    imported.write_text("from math import floor as compute_score\nscore = compute_score\n")
    for name in ("compute_score", "score"):
        load_config(None, [f"reward.custom_reward_function.path={imported}", f"reward.custom_reward_function.name={name}"])


@pytest.mark.parametrize("source", [
    "try:\n    from fastscore import compute_score\nexcept ImportError:\n    def compute_score(*a, **k):\n        return 0.0\n",
    "import sys\nif sys.version_info >= (3, 0):\n    def compute_score(*a, **k):\n        return 0.0\n",
    "compute_score, other = (lambda *a, **k: 0.0), None\n",
    "with open(__file__) as f:\n    compute_score = lambda *a, **k: 0.0\n",
])
def test_a_reward_function_bound_inside_a_block_or_by_unpacking_is_found(tmp_path, source):
    """Refused before: only top-level defs, plain assignments and imports were read, so a function
    defined under ``try``/``if`` or bound by tuple unpacking was reported missing."""
    path = tmp_path / "reward.py"
    path.write_text(source)
    load_config(None, [f"reward.custom_reward_function.path={path}"])


def test_a_name_bound_only_inside_a_function_is_not_the_modules(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text("def make():\n    compute_score = None\n    return [score for score in ()]\n")
    with pytest.raises(ConfigError, match=r"defines no 'compute_score' at its top level; it defines \['make'\]"):
        load_config(None, [f"reward.custom_reward_function.path={path}"])


def test_reward_kwargs_cannot_repeat_the_calls_own_arguments(scorer):
    with pytest.raises(ConfigError, match=r"reward.custom_reward_function.reward_kwargs has 'extra_info', an argument "
                                          r"the manager passes itself"):
        load_config(None, [f"reward.custom_reward_function.path={scorer}",
                           "reward.custom_reward_function.reward_kwargs.extra_info={a: 1}"])


def test_overlong_shaping_needs_the_rule_scores_beside_a_reward_model(tmp_path):
    """verl trains on the reward model's score alone, without the overlong penalty (it belongs to the
    rule scorer's manager); rlvr refuses to drop a configured penalty silently."""
    base = ["reward.reward_model.enable=true", f"reward.reward_model.path={tmp_path}", "reward.overlong_buffer.enable=true",
            "reward.overlong_buffer.len=16"]
    with pytest.raises(ConfigError, match=r"reward.overlong_buffer.enable=true with reward.reward_model.enable=true: "
                                          r".*reward.reward_model.add_rule_scores=true"):
        load_config(None, base)
    assert load_config(None, [*base, "reward.reward_model.add_rule_scores=true"]).reward.overlong_buffer.enable


@pytest.mark.parametrize("override", ["reward.reward_model.add_rule_scores=true", "reward.reward_model.weight=0.5"])
def test_reward_model_settings_without_the_reward_model_are_refused(override):
    key = override.split("=")[0].rsplit(".", 1)[1]
    with pytest.raises(ConfigError, match=rf"reward.reward_model.{key}=\S+ apply to the reward model's scores, and "
                                          r"reward.reward_model.enable is false"):
        load_config(None, [override])
