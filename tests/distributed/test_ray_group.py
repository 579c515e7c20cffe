"""The Ray worker group with fake workers (``ray_group_checks.py``, in a loopback-only network
namespace): ranks and rendezvous address from the environment, colocated roles in one process,
execute_all / execute_rank_zero, DP dispatch with padding, rollouts of different widths per
rank joined, a failing rank named, a failure on the driver's side of a call named as a worker
failure (with the last checkpoint, from ``fit``), a resource check that refuses what the
cluster lacks, and a shutdown that removes this Ray's /tmp folder (no other) and keeps its logs."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.ray
import ray  # noqa: E402,F401  make test installs Ray: a missing install fails, not skips

sys.path.insert(0, str(Path(__file__).parents[1]))
from loopback_only import loopback_only  # noqa: E402


@pytest.mark.slow  # a real Ray session with failing starts and placement-group checks: 21 s
def test_ray_worker_group_with_fake_workers(tmp_path):
    script = Path(__file__).with_name("ray_group_checks.py")
    done = subprocess.run(loopback_only([sys.executable, str(script), str(tmp_path)]), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "ALL CHECKS PASSED" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


def test_a_failure_joining_the_ranks_answers_reaches_the_user_with_rank_stage_and_checkpoint(tmp_path, monkeypatch):
    """The driver's side of a worker-group call (here: joining answers whose keys differ) fails
    as the worker failures do: one message naming the rank and the method, then, from ``fit``,
    the last checkpoint and how to resume. The call is the real ``RayWorkerGroup._call``; only
    the ranks' answers are given instead of computed."""
    from types import SimpleNamespace

    import torch

    import rlvr.trainer.main as trainer_main
    from rlvr.config import load_config
    from rlvr.distributed.ray_workers import RayWorkerGroup, WorkerError
    from rlvr.protocol import DataProto
    from rlvr.workers.hybrid import ActorRolloutRefWorker

    answers = [DataProto.from_dict({"responses": torch.ones(1, 2, dtype=torch.long), "input_ids": torch.ones(1, 3)}),
               DataProto.from_dict({"responses": torch.ones(1, 2, dtype=torch.long)})]
    group = object.__new__(RayWorkerGroup)
    group.world_size, group.roles, group.role = 2, {None: ActorRolloutRefWorker}, None
    group.workers = [SimpleNamespace(call=SimpleNamespace(remote=lambda *a, **k: None))] * 2
    monkeypatch.setattr(group, "_wait", lambda refs, method, ranks: answers, raising=False)

    class Trainer:  # what fit() needs of the trainer: a first generation through the group
        global_step, total_training_steps, val_reward_fn = 0, 3, None
        tracker = reward_fn = SimpleNamespace(close=lambda: None)
        wg = critic_wg = rollout_wg = None  # released after the run: nothing here to release

        def fit(self):
            uids = np.array(["a", "b"], dtype=object)
            group.generate_sequences(DataProto.from_dict({"input_ids": torch.ones(2, 1, dtype=torch.long)}, {"uid": uids}))

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "global_step_2").mkdir(parents=True)
    config = load_config(None, ["trainer.device=cpu", "trainer.n_gpus_per_node=2",
                                "actor_rollout_ref.actor.strategy=fsdp2", f"trainer.default_local_dir={run_dir}"])
    monkeypatch.setattr(trainer_main, "build_trainer", lambda config, progress_bar: Trainer())
    with pytest.raises(WorkerError) as err:
        trainer_main.fit(config)
    assert str(err.value) == (
        "generate_sequences: the answers of ranks [0, 1] could not be joined: DataProtoError: rank 1 answered keys "
        "['responses'], rank 0 ['input_ids', 'responses']\n"
        f"last checkpoint: {run_dir / 'checkpoints' / 'global_step_2'}; run the same command again to resume from it")


def test_a_worker_that_raises_while_starting_is_named_by_its_own_error():
    """Ray's message for an actor whose __init__ raised starts with its own line; the worker's
    error is the traceback's unindented end, however many lines it has."""
    from rlvr.distributed.ray_workers import creation_error

    message = ("The actor died because of an error raised in its creation task, ray::WorkerDict.__init__() (pid=1, "
               "ip=127.0.0.1, actor_id=ab, repr=<WorkerDict>)\n"
               "  File \"/x/ray_workers.py\", line 263, in __init__\n"
               "    self.workers = {role: cls(*args, **kwargs) for role in roles}\n"
               "                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
               "rlvr.config.validate.ConfigError: trainer.device=cuda, but torch sees no CUDA device\n"
               "set trainer.device=cpu\n\n")
    assert creation_error(message) == ("rlvr.config.validate.ConfigError: trainer.device=cuda, but torch sees no CUDA "
                                       "device\nset trainer.device=cpu")
    assert creation_error("one line only") == "one line only"
