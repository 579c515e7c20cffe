"""A run folder holds one run: a run with other settings, or resume_mode=disable, gets a folder of
its own and leaves every byte of the first run's folder as it was; the same command again resumes
in place; a refused resume writes nothing; a second Ctrl-C during the save discards that save;
what a killed save left is removed when the next run starts; each save says what it takes on disk."""

import os
from pathlib import Path

import pytest
import yaml

from rlvr.config import ConfigError
from rlvr.errors import TrainingInterrupted
from rlvr.trainer.checkpoint import step_dirs
from rlvr.trainer.main import build_trainer, run_training

ONE_STEP = ("trainer.total_training_steps=1", "trainer.save_freq=1", "trainer.val_before_train=false")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes (and every empty folder)."""
    out = {}
    for base, dirs, files in os.walk(folder):
        for name in files:
            path = Path(base, name)
            out[str(path.relative_to(folder))] = path.read_bytes()
        if not dirs and not files:
            out[str(Path(base).relative_to(folder)) + "/"] = b""
    return out


def steps_logged(folder: Path) -> list[int]:
    import json

    return [json.loads(line)["step"] for line in open(folder / "metrics.jsonl")]


def test_each_run_gets_a_folder_of_its_own_and_the_first_is_left_byte_for_byte(tiny_config, tmp_path, capsys):
    folder = tmp_path / "run"
    at = f"trainer.default_local_dir={folder}"
    run_training(tiny_config(*ONE_STEP, at))
    first = snapshot(folder)
    assert "checkpoints/global_step_1/actor_state.pt" in first and "metrics.jsonl" in first

    run_training(tiny_config(*ONE_STEP, at, "algorithm.adv_estimator=rloo"))  # the quick start's next command
    assert snapshot(folder) == first
    second = tmp_path / "run-2"
    assert yaml.safe_load((second / "config.yaml").read_text())["algorithm"]["adv_estimator"] == "rloo"
    assert steps_logged(second) == [1] and (second / "rollouts" / "1.jsonl").exists()  # its dumps under it too
    assert f"{folder} holds another run (its algorithm.adv_estimator differ from this one's): this run writes to " \
           f"{second}" in capsys.readouterr().out

    run_training(tiny_config(*ONE_STEP, at, "trainer.resume_mode=disable"))  # a fresh start: never over a run
    assert snapshot(folder) == first and steps_logged(tmp_path / "run-3") == [1]

    run_training(tiny_config(*ONE_STEP, at, "algorithm.adv_estimator=rloo", "trainer.total_training_steps=2"))
    assert steps_logged(second) == [1, 2]  # the same settings again: that run resumed where it stopped
    run_training(tiny_config(*ONE_STEP, at, "trainer.total_training_steps=2"))
    assert steps_logged(folder) == [1, 2] and not (tmp_path / "run-4").exists()


def test_a_refused_resume_writes_nothing(tiny_config, tmp_path):
    folder = tmp_path / "run"
    run_training(tiny_config(*ONE_STEP, f"trainer.default_local_dir={folder}"))
    first = snapshot(folder)
    changed = tiny_config(*ONE_STEP, f"trainer.default_local_dir={folder}", "trainer.seed=7",
                          "trainer.total_training_steps=2")
    with pytest.raises(ConfigError, match=r"trainer.seed: checkpoint 1, this run 7"):
        build_trainer(changed, progress_bar=False)  # (before, it rewrote config.yaml first)
    assert snapshot(folder) == first
    from_path = tiny_config(*ONE_STEP, f"trainer.default_local_dir={folder}", "trainer.seed=7",
                            f"trainer.resume_mode={folder / 'checkpoints' / 'global_step_1'}")
    with pytest.raises(ConfigError, match=r"trainer.seed: checkpoint 1, this run 7"):
        run_training(from_path)
    assert snapshot(folder) == first and not (tmp_path / "run-2").exists()


def test_a_second_ctrl_c_during_the_save_discards_that_save(tiny_config, tmp_path, interrupt):
    folder = tmp_path / "run"
    config = tiny_config("trainer.total_training_steps=4", "trainer.save_freq=1", "trainer.test_freq=2",
                         "trainer.val_before_train=false", f"trainer.default_local_dir={folder}")
    trainer = build_trainer(config, progress_bar=False)
    interrupt(trainer, trainer, "validate", 2)  # Ctrl-C in step 2's validation: its save starts...
    save = trainer.wg.save_checkpoint

    def cut_short(path):
        if Path(path).name == ".tmp-global_step_2":
            (Path(path) / "actor").mkdir()
            (Path(path) / "actor" / "model.safetensors").write_bytes(b"half")
            raise KeyboardInterrupt  # ...and Ctrl-C again in the middle of it
        return save(path)

    trainer.wg.save_checkpoint = cut_short
    with pytest.raises(TrainingInterrupted, match=r"^interrupted again while saving step 2: that save was discarded; "
                                                  r"the last checkpoint is step 1; run the same command again"):
        trainer.fit()
    trainer.tracker.close()
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["global_step_1",
                                                                         "latest_checkpointed_iteration.txt"]
    assert build_trainer(config, progress_bar=False).global_step == 1  # resumes from the intact one


def test_what_a_killed_save_left_is_removed_when_the_next_run_starts(tiny_config, tmp_path, capsys):
    folder = tmp_path / "run"
    run_training(tiny_config(*ONE_STEP, f"trainer.default_local_dir={folder}"))
    stale = folder / "checkpoints" / ".tmp-global_step_2"
    stale.mkdir()
    (stale / "actor_state.pt").write_bytes(b"x" * 1000)  # a kill -9 mid-save
    # the resumed run saves nothing (save_freq=-1): the folder is cleaned at its start, not by a save
    run_training(tiny_config(*ONE_STEP, f"trainer.default_local_dir={folder}", "trainer.save_freq=-1",
                             "trainer.total_training_steps=2"))
    assert not stale.exists() and steps_logged(folder) == [1, 2]
    assert f"removed {stale}: a save cut short" in capsys.readouterr().out


def test_each_save_says_what_it_takes_on_disk(tiny_config, tmp_path, capsys):
    folder = tmp_path / "run"
    run_training(tiny_config("trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.val_before_train=false",
                             f"trainer.default_local_dir={folder}", "trainer.max_actor_ckpt_to_keep=1"))
    out = capsys.readouterr()
    kept = step_dirs(folder / "checkpoints")
    assert [p.name for p in kept] == ["global_step_2"]  # verl's max_actor_ckpt_to_keep: the newest one
    size = sum(len(data) for data in snapshot(kept[0]).values())  # read back from disk
    line = f"saved {kept[0]} ({size / 1e6:.2f} MB); 1 checkpoint take {size / 1e6:.2f} MB " \
           "(trainer.max_actor_ckpt_to_keep=1 keeps the newest 1)"
    assert line in out.out + out.err


HOLD = """
import sys, time
from pathlib import Path
from rlvr.trainer.run_folder import lock_run_folder
lock = lock_run_folder(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(600)
"""


def test_a_run_folder_belongs_to_one_process_and_a_killed_one_does_not_keep_it(tmp_path, capsys):
    """Two `rlvr train` in one folder both wrote it (metrics.jsonl ending 4,4,5,5,...; checkpoints
    saved twice). Now the folder is locked by the process that runs in it: a second process is
    refused with the first one's pid, before it loads anything, and once the first is killed
    (kill -9 leaves its lock file behind) the next run goes ahead."""
    import subprocess
    import sys

    from rlvr.cli import main
    from rlvr.trainer.run_folder import LOCK_NAME, lock_run_folder

    folder = tmp_path / "run"
    argv = ["train", f"trainer.default_local_dir={folder}", f"actor_rollout_ref.model.path={tmp_path / 'none'}"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, env=env)
    try:
        assert holder.stdout.readline() == b"locked\n"
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{folder} is in use by process {holder.pid} (its lock: {folder / LOCK_NAME})" in err
        assert "model path" not in err  # refused before anything loads
        with pytest.raises(ConfigError, match=rf"in use by process {holder.pid}"):  # two starting at once
            lock_run_folder(folder)
    finally:
        holder.kill()
        holder.wait()
    assert (folder / LOCK_NAME).read_text().strip() == str(holder.pid)  # what kill -9 leaves behind
    assert main(argv) == 2  # the stale lock does not block: this run gets as far as the missing model
    assert "model path" in capsys.readouterr().err
    assert not (folder / LOCK_NAME).exists()  # a run that ends removes its lock


def test_run_training_holds_the_lock_while_it_trains(tiny_config, tmp_path, monkeypatch):
    """The lock is held for the whole run (a second run_training from inside fit is refused, naming
    this process), and an ended run that wrote nothing leaves no folder behind."""
    import rlvr.trainer.main as main_module

    folder = tmp_path / "run"
    config = tiny_config(f"trainer.default_local_dir={folder}")
    seen = []

    def fit_that_starts_another(cfg, *args, **kwargs):
        with pytest.raises(ConfigError, match=rf"{folder} is in use by process {os.getpid()}"):
            run_training(config)
        seen.append(True)
        return {}

    monkeypatch.setattr(main_module, "fit", fit_that_starts_another)
    run_training(config)
    assert seen == [True] and not folder.exists()


def test_a_run_with_other_settings_started_while_the_first_loads_gets_a_folder_of_its_own(tiny_config, tmp_path,
                                                                                          monkeypatch, capsys):
    """The first run locks its folder before it loads and writes config.yaml only once its model has
    loaded. A second run with other settings started in that window was refused as "in use" (it
    could not tell the first run's settings); it goes to ``run-2`` now, as it does once config.yaml
    is there, and so does ``resume_mode=disable``. The same command twice is still refused."""
    import rlvr.trainer.main as main_module

    folder = tmp_path / "run"
    first = tiny_config(f"trainer.default_local_dir={folder}")
    started = []

    def loading(cfg, *args, **kwargs):  # fit, for the first run still loading: nothing written but the lock
        started.append(cfg.trainer.default_local_dir)
        if len(started) == 1:
            assert [p.name for p in folder.iterdir()] == [".rlvr.lock"]
            run_training(tiny_config(f"trainer.default_local_dir={folder}", "algorithm.adv_estimator=rloo"))
            run_training(tiny_config(f"trainer.default_local_dir={folder}", "trainer.resume_mode=disable"))
            with pytest.raises(ConfigError, match=rf"{folder} is in use by process {os.getpid()}"):
                run_training(first)
        return {}

    monkeypatch.setattr(main_module, "fit", loading)
    run_training(first)
    assert started == [str(folder.resolve()), str(tmp_path.resolve() / "run-2"), str(tmp_path.resolve() / "run-2")]
    out = capsys.readouterr().out
    assert f"{folder} is in use by process {os.getpid()}, loading another run (its algorithm.adv_estimator differ " \
           f"from this one's): this run writes to {folder}-2" in out
    assert f"{folder} is in use by process {os.getpid()}, loading another run (trainer.resume_mode=disable starts " \
           f"a new one): this run writes to {folder}-2" in out


def test_a_second_ctrl_c_with_no_checkpoint_promises_no_resume(tiny_config, tmp_path, interrupt):
    """With no checkpoint on disk, the message said "run the same command again to resume": the
    same command starts over. It says so now (and so do the Ray driver's and a failed worker's)."""
    folder = tmp_path / "run"
    config = tiny_config("trainer.total_training_steps=2", "trainer.save_freq=-1", "trainer.test_freq=1",
                         "trainer.val_before_train=false", f"trainer.default_local_dir={folder}")
    trainer = build_trainer(config, progress_bar=False)
    interrupt(trainer, trainer, "validate", 1)  # Ctrl-C in step 1's validation: its save starts...

    def cut_short(path):
        raise KeyboardInterrupt  # ...and Ctrl-C again in the middle of it

    trainer.wg.save_checkpoint = cut_short
    with pytest.raises(TrainingInterrupted) as stopped:
        trainer.fit()
    trainer.tracker.close()
    assert str(stopped.value) == ("interrupted again while saving step 1: that save was discarded; no checkpoint "
                                  "exists yet, so running the same command again starts from the beginning")
    from rlvr.trainer.main import resume_hint

    assert "resume" not in resume_hint(None) and "starts from the beginning" in resume_hint(None)
    assert resume_hint(folder / "checkpoints" / "global_step_3") == \
        f"last checkpoint: {folder / 'checkpoints' / 'global_step_3'}; run the same command again to resume from it"


def test_the_last_line_names_only_what_the_run_wrote(tiny_config, tmp_path, capsys):
    """The last line named metrics.jsonl with the jsonl logger off, where there is none."""
    folder = tmp_path / "run"
    run_training(tiny_config("trainer.total_training_steps=1", "trainer.save_freq=-1", "trainer.logger=[console]",
                             "trainer.val_before_train=false", f"trainer.default_local_dir={folder}"))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert not (folder / "metrics.jsonl").exists()
    assert last == f"[rlvr] run directory: {folder.resolve()} (config.yaml, rollouts/)"


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc, which takes no new folders")
def test_a_run_folder_that_cannot_be_made_is_a_clear_error(tmp_path, capsys):
    """A parent that takes no folders (a file as the folder or a parent is refused at load): the
    message names trainer.default_local_dir and the path, with no traceback, before anything loads."""
    from rlvr.cli import main

    folder = Path("/proc/rlvr-no-folder/run")
    assert main(["train", f"trainer.default_local_dir={folder}", f"actor_rollout_ref.model.path={tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err
    assert f"trainer.default_local_dir={folder}: cannot make the run folder (No such file or directory" in err
    assert "Traceback" not in err and "model path" not in err


def test_an_interrupted_run_that_does_not_auto_resume_is_told_the_command_that_resumes_it():
    """Under resume_mode=disable (or a path) the same command starts afresh in another folder, so
    the interrupt message names the command that resumes this run instead."""
    from types import SimpleNamespace

    from rlvr.trainer.ppo_trainer import RLTrainer

    def told(mode):
        fake = SimpleNamespace(config=SimpleNamespace(trainer=SimpleNamespace(resume_mode=mode,
                                                                              default_local_dir="runs/x-2")))
        return RLTrainer._how_to_resume(fake)

    assert told("auto") == "run the same command again to resume (trainer.resume_mode=auto)"
    assert "run again with trainer.resume_mode=auto trainer.default_local_dir=runs/x-2" in told("disable")


def test_the_folders_settings_are_read_through_the_resumes_getters(tmp_path):
    """A setting the run does not read (a critic's lr under GRPO; the warm-up queue of a synchronous
    run) is not a difference: the folder's config.yaml was compared key by key, raw, so such a change
    sent `rlvr train` to <dir>-2 where the resume itself would have gone on."""
    from rlvr.config import load_config, to_yaml
    from rlvr.trainer.checkpoint import compatibility
    from rlvr.trainer.run_folder import _same, saved_compatibility

    (tmp_path / "config.yaml").write_text(to_yaml(load_config(None, ["critic.optim.lr=1e-5"])))
    grpo = load_config(None, ["critic.optim.lr=5e-5", "trainer.v1.colocate_async.num_warmup_batches=3"])
    assert _same(saved_compatibility(tmp_path), compatibility(grpo))
    ppo = ["algorithm.adv_estimator=gae", "critic.optim.lr=1e-5"]
    (tmp_path / "config.yaml").write_text(to_yaml(load_config(None, ppo)))
    assert not _same(saved_compatibility(tmp_path), compatibility(load_config(None, [*ppo, "critic.optim.lr=5e-5"])))
