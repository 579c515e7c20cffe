"""The layout is the architecture: a stage imports only what lies below it.

``trainer/`` drives every stage, so nothing but the trainer itself and the command line may
import it; errors the stages raise for the trainer to catch live in ``rlvr/errors.py``.
"""

import ast
from pathlib import Path

import rlvr

RLVR = Path(rlvr.__file__).parent
MAY_IMPORT_TRAINER = {RLVR / "cli.py", RLVR / "serve" / "runner.py"}  # the command line (rlvr serve's)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_stage_below_the_trainer_imports_it():
    upward = {}
    for path in sorted(RLVR.rglob("*.py")):
        if path.is_relative_to(RLVR / "trainer") or path in MAY_IMPORT_TRAINER:
            continue
        found = sorted(m for m in imported_modules(path) if m == "rlvr.trainer" or m.startswith("rlvr.trainer."))
        if found:
            upward[str(path.relative_to(RLVR))] = found
    # workers/actor.py, rewards/manager.py and distributed/ray_workers.py once took StopTraining from rlvr.trainer
    assert upward == {}


def test_stop_training_family_shares_one_base():
    from rlvr.distributed.ray_workers import ResourceError, WorkerError
    from rlvr.errors import StopTraining
    from rlvr.rewards.manager import RewardError
    from rlvr.trainer.ppo_trainer import DynamicSamplingError
    from rlvr.workers.actor import NonFiniteLossError

    for cls in (ResourceError, WorkerError, RewardError, DynamicSamplingError, NonFiniteLossError):
        assert issubclass(cls, StopTraining), cls
