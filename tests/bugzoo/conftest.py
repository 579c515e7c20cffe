"""The trainer tests' tiny training setup (``tiny_config``: the tiny model, 16 arithmetic prompts)."""

from tests.trainer.conftest import tiny_config, tiny_data  # noqa: F401  (fixtures, used by name)
