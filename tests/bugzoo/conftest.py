"""The trainer tests' tiny training setup (``tiny_config``: the tiny model, 16 arithmetic prompts),
the tiny model with its tokenizer (``tiny``), and an engine that samples nothing (``ScriptOnly``)
for rollouts whose every turn is scripted."""

import pytest

from rlvr.models import load_model
from rlvr.rollout import Completion, NativeRollout
from tests.trainer.conftest import tiny_config, tiny_data  # noqa: F401  (fixtures, used by name)


class ScriptOnly(NativeRollout):
    """Samples nothing: every turn is scripted (the teacher-forced engine fills it in)."""

    def generate(self, prompts, params, groups=None, max_new_tokens=None):
        return [Completion([], [], "stop") for _ in prompts]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tokenizer):
    return load_model(tiny_model_dir, "float32", "cpu"), tokenizer
