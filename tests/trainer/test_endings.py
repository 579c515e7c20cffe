"""Runs that end badly end with a message: a diverging run reaches the non-finite guard, a
reward function that calls sys.exit() is named, a full disk during a save keeps the step's
record. Each of these once ended in an internal error or a bare traceback (issue 47, §2)."""

import errno
import json
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.errors import StopTraining
from rlvr.trainer.main import build_trainer


def records(config):
    path = Path(config.trainer.default_local_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("lr", ["1e9", "1e30"])
def test_a_diverging_run_reaches_the_non_finite_guard(tiny_config, lr):
    """One optimizer step per batch (old log-probs from the update's own forward, as in the
    default job): lr=1e9 blows the weights up at step 1, the log-probs turn NaN from step 2,
    and the guard stops the run after max_consecutive_skipped_steps (here 2) skipped steps, naming
    the cause; it once ended at step 2 in 'union conflict on batch['old_log_probs']' (NaN != NaN)."""
    from rlvr.workers.actor import NonFiniteLossError

    config = tiny_config(f"actor_rollout_ref.actor.optim.lr={lr}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                         "actor_rollout_ref.actor.max_consecutive_skipped_steps=2", "trainer.total_training_steps=6",
                         "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1")
    trainer = build_trainer(config, progress_bar=False)
    with pytest.raises(NonFiniteLossError, match="2 optimizer steps in a row were skipped"):
        trainer.fit()
    trainer.tracker.close()


def test_train_refuses_what_the_memory_plan_refuses_before_loading(tmp_path, monkeypatch, capsys):
    """data.max_response_length=100000: `rlvr plan` and `--dry-run` refuse it (2070 GB in the
    update for the built-in model), but plain `train` once loaded everything and generated for
    minutes toward a crash; it is refused first, with the plan's message, nothing loaded."""
    import rlvr.trainer.main as trainer_main

    monkeypatch.setattr(trainer_main, "build_trainer", lambda *args, **kwargs: pytest.fail("the run was built"))
    assert main(["train", "data.max_response_length=100000", f"trainer.default_local_dir={tmp_path / 'run'}",
                 "--device-memory-gb", "80"]) == 2
    err = capsys.readouterr().err
    assert "the memory plan needs" in err and "over the 80.00 GB available" in err and "Traceback" not in err, err


STARTING = """
import sys

class Interrupted:  # Ctrl-C while torch loads, the first seconds of `rlvr train`
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt

sys.meta_path.insert(0, Interrupted())
sys.argv = ["rlvr", "train"]
from rlvr.cli import main
sys.exit(main())
"""


def test_ctrl_c_while_starting_is_one_line(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", STARTING], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 130 and done.stderr == "rlvr: interrupted while starting; nothing was done\n", done.stderr


def test_ctrl_c_while_the_run_loads_is_one_line(tiny_config, monkeypatch, capsys, tmp_path):
    """Ctrl-C while the model and data load (before the fit loop, which handles its own)."""
    import rlvr.trainer.main as trainer_main

    def loading(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_main, "build_trainer", loading)
    assert main(["train", f"trainer.default_local_dir={tmp_path / 'run'}"]) == 130
    err = capsys.readouterr().err
    assert err.endswith("rlvr train: interrupted before training started; nothing was saved\n"), err


def test_a_full_disk_during_a_save_says_so_and_keeps_the_steps_record(tiny_config):
    """The disk fills while step 2's checkpoint is written: the run stops with what happened and
    what to do (not torch's 'PytorchStreamWriter failed writing file'), the partial folder is
    gone, step 1's checkpoint stays the last, and step 2's record is in metrics.jsonl."""
    config = tiny_config("trainer.save_freq=1", "trainer.val_before_train=false", "trainer.test_freq=-1")
    trainer = build_trainer(config, progress_bar=False)
    original, calls = trainer.wg.save_checkpoint, []

    def filling(folder):
        calls.append(folder)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(folder / "actor" / "model.safetensors"))
        return original(folder)

    trainer.wg.save_checkpoint = filling
    with pytest.raises(StopTraining, match=r"cannot save step 2 .*No space left on device.*the last complete "
                                           r"checkpoint is .*global_step_1.*free space"):
        trainer.fit()
    trainer.tracker.close()
    assert [r["step"] for r in records(config)] == [1, 2]
    root = Path(config.trainer.default_local_dir) / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["global_step_1"]


def test_a_run_folder_that_cannot_be_written_is_one_message(tmp_path, monkeypatch, capsys):
    """A read-only run folder (simulated: the tests run as root, for whom chmod does not bite)."""
    import pathlib

    blocked = tmp_path / "read-only"
    original = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):
        if str(self).startswith(str(blocked)):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    assert main(["train", f"trainer.default_local_dir={blocked / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert f"rlvr train: error: Read-only file system: {blocked}" in err and "Traceback" not in err, err
    assert "trainer.default_local_dir" in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_cuda_asked_of_a_machine_without_one_is_one_message(tiny_config, tmp_path, capsys):
    from rlvr.config import to_yaml

    (tmp_path / "tiny.yaml").write_text(to_yaml(tiny_config("trainer.device=cuda")))
    assert main(["train", "--config", str(tmp_path / "tiny.yaml")]) == 2
    err = capsys.readouterr().err
    assert "trainer.device=cuda, but torch sees no CUDA device" in err and "trainer.device=cpu" in err, err
    assert "Traceback" not in err
