"""Checkpoint files as a disk, a kill or a user leaves them: what is written whole, what is refused.
No training: the checkpoints are written by ``checkpoint.save`` with stand-in parts."""

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rlvr.cli import main
from rlvr.config import ConfigError
from rlvr.trainer import checkpoint
from rlvr.trainer.checkpoint import (DamagedCheckpointError, CheckpointWriteError, disk_refused, save, step_dirs)


def parts(folder: Path, weight: float = 1.0) -> None:
    """What a worker writes: the policy folder (weights and config) and its optimizer state."""
    (folder / "actor").mkdir()
    save_file({"w": torch.full((2,), weight)}, folder / "actor" / "model.safetensors")
    (folder / "actor" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    torch.save({"optimizer": {}}, folder / "actor_state.pt")


def test_a_full_disk_is_recognised_as_each_writer_words_it():
    """safetensors' Rust error and torch's C++ stream raise no OSError: a full disk during a save was
    a traceback, and the step's record was lost, where the docs promise the free-space message."""
    assert disk_refused(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_refused(Exception("Error while serializing: I/O error: No space left on device (os error 28)"))
    wrapped = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")
    assert disk_refused(wrapped)
    try:  # an OSError anywhere in the chain
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as inner:
            raise RuntimeError("could not write") from inner
    except RuntimeError as outer:
        assert disk_refused(outer)
    assert not disk_refused(RuntimeError("a bug")) and not disk_refused(OSError(errno.ENOENT, "gone"))


def test_a_disk_that_refuses_the_weights_stops_the_run_with_the_message(tmp_path):
    root = tmp_path / "checkpoints"

    def full(folder: Path) -> None:
        raise Exception("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(CheckpointWriteError, match=r"cannot save step 1 .*No space left on device.*free on that disk"):
        save(root, 1, full, {"step": 1})
    assert list(root.iterdir()) == []  # the partial folder removed


def test_saving_a_saved_step_again_leaves_it_as_it_is(tmp_path):
    """A Ctrl-C during the pruning after a save made the interrupt handler write the step again:
    the old copy was removed before the new one was renamed in, and a second Ctrl-C there left a
    step folder with files missing, which the next run picked and died on."""
    root = tmp_path / "checkpoints"
    first = save(root, 2, parts, {"step": 2})

    def must_not_run(folder):
        raise AssertionError("the step was written again")

    assert save(root, 2, must_not_run, {"step": 2}) == first
    assert (first / "trainer_state.pt").is_file() and not list(root.glob(".tmp-*"))


def test_a_pruning_cut_short_leaves_no_step_folder_with_files_missing(tmp_path, monkeypatch, capsys):
    root = tmp_path / "run" / "checkpoints"
    for step in (1, 2):
        save(root, step, parts, {"step": step})
    real_rmtree = checkpoint.shutil.rmtree

    def interrupted(path, ignore_errors=False):
        (Path(path) / "actor_state.pt").unlink()  # part of it gone, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save(root, 3, parts, {"step": 3}, keep=1)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    assert [p.name for p in step_dirs(root)] == ["global_step_2", "global_step_3"]  # step 1 is out of sight
    checkpoint.check_intact(step_dirs(root)[0])
    from rlvr.config import load_config, to_yaml
    from rlvr.trainer.run_folder import claim_run_folder
    config = load_config(None, [f"trainer.default_local_dir={tmp_path / 'run'}"])
    (tmp_path / "run" / "config.yaml").write_text(to_yaml(config))  # the run's own, resumed
    assert claim_run_folder(config) is config
    assert not list(root.glob(".pruned-*")) and "a removal of an old checkpoint cut short" in capsys.readouterr().out


@pytest.mark.parametrize("remove", ["actor_state.pt", "trainer_state.pt", "actor/model.safetensors"])
def test_a_checkpoint_with_a_part_missing_is_refused_naming_it_and_the_newest_whole_one(tmp_path, remove):
    """Only the files present were checked: a missing actor_state.pt was a FileNotFoundError
    traceback after the model loaded."""
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        save(root, step, parts, {"step": step})
    (root / "global_step_2" / remove).unlink()
    with pytest.raises(DamagedCheckpointError, match=rf"cannot resume from .*global_step_2: .*global_step_2/"
                                                     rf"{remove.split('/')[0]}.* The newest intact checkpoint is "
                                                     rf".*global_step_1"):
        checkpoint.check_intact(root / "global_step_2")


def with_critic(folder: Path) -> None:
    parts(folder)
    (folder / "critic").mkdir()
    save_file({"v": torch.zeros(2)}, folder / "critic" / "model.safetensors")
    torch.save({"optimizer": {}}, folder / "critic_state.pt")


@pytest.mark.parametrize("remove, named", [("critic_state.pt", "critic_state.pt"),
                                           ("critic/model.safetensors", "critic")])
def test_a_critic_missing_either_part_is_refused(tmp_path, remove, named):
    """A critic_state.pt without the critic's weights passed the check (only the other way round was
    read), and the critic's load failed after the models."""
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        save(root, step, with_critic, {"step": step})
    checkpoint.check_intact(root / "global_step_2")  # whole: nothing to say
    (root / "global_step_2" / remove).unlink()
    with pytest.raises(DamagedCheckpointError, match=rf"global_step_2/{named}\b.* The newest intact checkpoint is "
                                                     rf".*global_step_1"):
        checkpoint.check_intact(root / "global_step_2")


def test_a_folder_of_verls_checkpoints_is_refused_not_trained_over(tmp_path):
    """verl saves global_step_<k>/actor/ shards in the run folder itself; resume_mode=auto found no
    rlvr checkpoint there and started a fresh run inside it, from step 0."""
    from rlvr.config import load_config

    run = tmp_path / "verl_run"
    (run / "global_step_5" / "actor").mkdir(parents=True)
    (run / "global_step_5" / "actor" / "model_world_size_2_rank_0.pt").write_bytes(b"x")
    (run / "latest_checkpointed_iteration.txt").write_text("5")
    config = load_config(None, [f"trainer.default_local_dir={run}"])
    with pytest.raises(ConfigError, match=r"holds verl's checkpoints \(\['global_step_5'\].*verl's model merger"):
        checkpoint.resolve_resume(config)


def test_auto_resume_says_so_when_the_tracker_names_an_older_complete_step(tmp_path, capsys):
    """verl resumes from the step latest_checkpointed_iteration.txt names; rlvr from the newest
    complete step folder (a folder appears only whole, the tracker after it). When the two
    disagree it resumed from the newest without a word; it now says which, why, and how to
    resume from the tracker's step."""
    from rlvr.config import load_config

    run = tmp_path / "run"
    root = run / "checkpoints"
    for step in (1, 2, 3):
        save(root, step, parts, {"step": step})
    config = load_config(None, [f"trainer.default_local_dir={run}"])
    assert checkpoint.resolve_resume(config) == root / "global_step_3"
    assert capsys.readouterr().out == ""  # the tracker agrees: nothing to say

    (root / "latest_checkpointed_iteration.txt").write_text("2")  # a save cut short after its rename, or an edit
    assert checkpoint.resolve_resume(config) == root / "global_step_3"
    out = capsys.readouterr().out
    assert f"[rlvr] {root / 'latest_checkpointed_iteration.txt'} names step 2, but a newer complete checkpoint is " \
           f"there: resuming from the newest complete checkpoint, {root / 'global_step_3'}" in out
    assert f"set trainer.resume_mode={root / 'global_step_2'}" in out


@pytest.mark.parametrize("tracker, why", [
    ("7", "names step 7, but {root}/global_step_7 is not there"),                      # moved aside, removed
    ("2", "names step 2, but {root}/global_step_2/actor_state.pt is not a whole torch.save file"),  # damaged
    ("two", "names no step ('two')"),
])
def test_a_tracker_naming_a_missing_or_damaged_step_is_said_and_the_newest_complete_one_used(tmp_path, capsys,
                                                                                               tracker, why):
    from rlvr.config import load_config

    run = tmp_path / "run"
    root = run / "checkpoints"
    for step in (1, 2, 3):
        save(root, step, parts, {"step": step})
    state = root / "global_step_2" / "actor_state.pt"
    state.write_bytes(state.read_bytes()[:20])  # truncated by a copy cut short
    (root / "latest_checkpointed_iteration.txt").write_text(tracker)
    config = load_config(None, [f"trainer.default_local_dir={run}"])
    assert checkpoint.resolve_resume(config) == root / "global_step_3"
    out = capsys.readouterr().out
    assert f"[rlvr] {root / 'latest_checkpointed_iteration.txt'} {why.format(root=root)}" in out
    assert f"; resuming from the newest complete checkpoint, {root / 'global_step_3'}" in out


def test_a_rewrite_cut_short_keeps_the_file_it_had(tmp_path, monkeypatch):
    """metrics.jsonl (rewound on resume) and config.yaml (rewritten on resume) were truncated, then
    written: a kill or a full disk between emptied the history, or sent the next run to a new folder."""
    from rlvr.trainer.checkpoint import replace_text

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    real = Path.write_text

    def full(self, text, *args, **kwargs):
        real(self, text[:3], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError):
        replace_text(path, '{"step": 1}\n{"step": 2}\n')
    monkeypatch.setattr(Path, "write_text", real)
    assert path.read_text() == '{"step": 1}\n'


def test_export_refuses_a_checkpoint_that_would_not_load_and_leaves_nothing_when_cut_short(tmp_path, capsys,
                                                                                           monkeypatch):
    """A checkpoint without its weights, or with a config.json that is not JSON, exported with a
    success line; a Ctrl-C during the copy left a partial OUT that the next export called taken."""
    root = tmp_path / "checkpoints"
    good = save(root, 1, parts, {"step": 1})
    broken = save(root, 2, parts, {"step": 2})
    (broken / "actor" / "config.json").write_text("")
    assert main(["export", str(broken), str(tmp_path / "out")]) == 2
    assert "config.json is not readable JSON" in capsys.readouterr().err and not (tmp_path / "out").exists()
    (broken / "actor" / "model.safetensors").unlink()
    assert main(["export", str(broken), str(tmp_path / "out")]) == 2
    assert "holds no *.safetensors weights" in capsys.readouterr().err

    import shutil

    real_copytree = shutil.copytree

    def cut_short(src, dst, *args, **kwargs):
        os.makedirs(dst)
        (Path(dst) / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copytree", cut_short)
    assert main(["export", str(good), str(tmp_path / "out")]) == 130  # Ctrl-C: the command's own status
    assert not (tmp_path / "out").exists() and not (tmp_path / ".tmp-out").exists()
    monkeypatch.setattr(shutil, "copytree", real_copytree)
    assert main(["export", str(good), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_the_run_folder_goes_to_the_workers_absolute(tiny_config, tmp_path, monkeypatch):
    """A relative trainer.default_local_dir went on as it was: a Ray TaskRunner started in another
    folder (runtime_env.working_dir) wrote the whole run, checkpoints included, under Ray's
    temporary folder, and the next run found nothing to resume."""
    import rlvr.trainer.main as main_module

    monkeypatch.chdir(tmp_path)
    seen = []
    monkeypatch.setattr(main_module, "fit", lambda cfg, *a, **k: seen.append(cfg) or {})
    main_module.run_training(tiny_config("trainer.default_local_dir=runs/here",
                                         "trainer.rollout_data_dir=runs/here/dumps"))
    assert seen[0].trainer.default_local_dir == str(tmp_path / "runs" / "here")
    assert seen[0].trainer.rollout_data_dir == str(tmp_path / "runs" / "here" / "dumps")


def sharded_parts(folder: Path) -> None:
    """A policy too big for one file: two shards and the index naming them (save_pretrained past
    its max_shard_size, 50 GB by default)."""
    (folder / "actor").mkdir()
    save_file({"a": torch.zeros(2)}, folder / "actor" / "model-00001-of-00002.safetensors")
    save_file({"b": torch.zeros(2)}, folder / "actor" / "model-00002-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (folder / "actor" / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "actor" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    torch.save({"optimizer": {}}, folder / "actor_state.pt")


def test_a_checkpoint_missing_a_shard_its_index_names_is_refused_and_not_exported(tmp_path, capsys):
    """One shard present was enough for the check: a resume loaded the model before the loader found
    the shard missing (without the newest intact checkpoint), and export copied the folder, with a
    success line, into one transformers cannot load."""
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        save(root, step, sharded_parts, {"step": step})
    checkpoint.check_intact(root / "global_step_2")  # whole: nothing to say
    (root / "global_step_2" / "actor" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DamagedCheckpointError, match=r"global_step_2/actor/model.safetensors.index.json names "
                                                     r"model-00002-of-00002.safetensors, which is missing.* The "
                                                     r"newest intact checkpoint is .*global_step_1"):
        checkpoint.check_intact(root / "global_step_2")
    assert main(["export", str(root / "global_step_2"), str(tmp_path / "out")]) == 2
    assert "model-00002-of-00002.safetensors, which is missing" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, named", [
    ("actor_rollout_ref.actor.optim.lr=5e-6", r"actor_rollout_ref.actor.optim.lr: checkpoint 1e-06, this run 5e-06"),
    ("actor_rollout_ref.actor.optim.weight_decay=0.1", r"optim.weight_decay: checkpoint 0.01, this run 0.1"),
    ("actor_rollout_ref.actor.optim.betas=[0.9,0.95]", r"optim.betas: checkpoint \[0.9, 0.999\], this run \[0.9, 0.95\]"),
])
def test_a_resume_with_another_learning_rate_is_refused_not_overridden_by_the_checkpoint(tmp_path, change, named):
    """The optimizer's saved state holds its groups' lr, weight_decay and betas, and loading it puts them
    back (torch's load_state_dict; the scheduler's base_lrs likewise): a resume with lr lowered by hand
    went on at the saved lr without a word (resumed with lr=5e-2 over a 1e-3 run: the groups read 1e-3).
    A longer run (total_training_steps) resumes as before."""
    from rlvr.config import load_config

    base = [f"trainer.default_local_dir={tmp_path / 'run'}", "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.actor.optim.weight_decay=0.01", "actor_rollout_ref.actor.optim.betas=[0.9,0.999]"]
    saved = load_config(None, base)
    root = tmp_path / "checkpoints"
    path = save(root, 1, parts, {"step": 1, "compatibility": checkpoint.compatibility(saved)})
    assert checkpoint.load_trainer_state(path, load_config(None, [*base, "trainer.total_training_steps=99"]))
    with pytest.raises(ConfigError, match=named):
        checkpoint.load_trainer_state(path, load_config(None, [*base, change]))


@pytest.mark.parametrize("setting, change, named", [
    ("algorithm.adv_estimator=gae", "critic.optim.lr=5e-5", r"critic.optim.lr: checkpoint 1e-05, this run 5e-05"),
    ("algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.01",
     r"algorithm.kl_ctrl.kl_coef: checkpoint 0.001, this run 0.01\n.*the KL controller's saved value"),
])
def test_a_resume_with_another_critic_lr_or_kl_coefficient_is_refused_where_it_is_read(tmp_path, setting, change,
                                                                                      named):
    """PPO's critic restores its optimizer's lr as the actor's does, and the KL-in-reward controller its
    saved value (trainer state 'kl_ctrl'): either change was overwritten on resume, unsaid. A GRPO run
    reads neither, so changing them there resumes."""
    from rlvr.config import load_config

    base = [f"trainer.default_local_dir={tmp_path / 'run'}", "critic.optim.lr=1e-5", "algorithm.kl_ctrl.kl_coef=0.001"]
    for layer, refused in ((setting, True), ("algorithm.adv_estimator=grpo", False)):
        saved = load_config(None, [*base, layer])
        path = save(tmp_path / f"checkpoints-{refused}", 1, parts, {"step": 1, "compatibility":
                                                                    checkpoint.compatibility(saved)})
        if refused:
            with pytest.raises(ConfigError, match=named):
                checkpoint.load_trainer_state(path, load_config(None, [*base, layer, change]))
        else:
            assert checkpoint.load_trainer_state(path, load_config(None, [*base, layer, change]))
