"""Checkpoints: exact resume (clean stop and kill), atomic saves, compatibility checks, HF folders."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlvr.config import ConfigError
from rlvr.errors import TrainingInterrupted
from rlvr.trainer.checkpoint import latest_checkpoint
from rlvr.trainer.main import build_trainer

VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/time_per_step", "perf/throughput", "time",
            "perf/cpu_max_rss_gb", "perf/max_memory_allocated_gb")  # memory differs from process to process


def stable(record):
    return {k: v for k, v in record.items() if not k.startswith(VOLATILE)}


def records(run_dir):
    return [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]


def weights(trainer):
    return [p.detach().clone() for p in trainer.wg.worker.actor.model.parameters()]


def full_run(tiny_config, run_dir, *extra):
    config = tiny_config("trainer.total_training_steps=4", "trainer.save_freq=2", f"trainer.default_local_dir={run_dir}",
                         "trainer.val_before_train=false", *extra)
    trainer = build_trainer(config, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    return config, trainer


def test_interrupted_run_resumes_exactly(tiny_config, tmp_path, interrupt_and_resume):
    _, reference = full_run(tiny_config, tmp_path / "ref")
    expected = records(tmp_path / "ref")

    config = tiny_config("trainer.total_training_steps=4", "trainer.save_freq=2",
                         f"trainer.default_local_dir={tmp_path / 'cut'}", "trainer.val_before_train=false")
    resumed = interrupt_and_resume(build_trainer(config, progress_bar=False), 3, "step 2 was already saved")
    got = records(tmp_path / "cut")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert [stable(r) for r in got] == [stable(r) for r in expected]
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(reference)))
    # the same prompts in the same steps: none repeated or skipped across the interruption
    assert prompts_by_step(tmp_path / "cut") == prompts_by_step(tmp_path / "ref")
    every = [p for step in prompts_by_step(tmp_path / "cut") for p in step]
    assert len(every) == 8 and len(set(every)) == 8  # 4 steps x 2 prompts, all distinct within the epoch


def test_a_mixture_of_experts_resumes_exactly(tiny_config, tmp_path, interrupt_and_resume, tiny_moe_model_dir):
    """Qwen3-MoE: saved per expert (save_pretrained reverts transformers' fusing), fused in memory.
    Before, resume compared the stored names with the fused ones and refused the checkpoint."""
    moe = f"actor_rollout_ref.model.path={tiny_moe_model_dir}"
    _, reference = full_run(tiny_config, tmp_path / "ref", moe)
    config = tiny_config("trainer.total_training_steps=4", "trainer.save_freq=2", moe,
                         f"trainer.default_local_dir={tmp_path / 'cut'}", "trainer.val_before_train=false")
    resumed = interrupt_and_resume(build_trainer(config, progress_bar=False), 3, "step 2 was already saved")
    assert [stable(r) for r in records(tmp_path / "cut")] == [stable(r) for r in records(tmp_path / "ref")]
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(reference)))
    from rlvr.models import load_model

    initial = load_model(tiny_moe_model_dir).model.layers[0].mlp.experts.gate_up_proj
    assert not torch.equal(resumed.wg.worker.model.model.layers[0].mlp.experts.gate_up_proj, initial)  # trained


def prompts_by_step(run_dir):
    steps = []
    for step in range(1, 5):
        lines = [json.loads(line) for line in open(Path(run_dir) / "rollouts" / f"{step}.jsonl")]
        steps.append(sorted({line["prompt"] for line in lines}))
    return steps


def start_run_slow_at_step_3(config, tmp_path, stderr):
    """`rlvr train` of ``config`` in a subprocess whose step 3 first waits 60 s (long enough to
    kill or terminate it there)."""
    from rlvr.config import to_yaml
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(to_yaml(config))
    slow = tmp_path / "slow.py"
    slow.write_text("import sys, time\nfrom rlvr.cli import main\nfrom rlvr.trainer import ppo_trainer\n"
                    "orig = ppo_trainer.RLTrainer.train_step\n"
                    "def train_step(self, batch, more):\n    if self.global_step == 3: time.sleep(60)\n"
                    "    return orig(self, batch, more)\n"
                    "ppo_trainer.RLTrainer.train_step = train_step\nsys.exit(main(['train', '--config', sys.argv[1]]))\n")
    return subprocess.Popen([sys.executable, str(slow), str(cfg_file)], stdout=subprocess.DEVNULL, stderr=stderr,
                            text=True)


def test_killed_run_resumes_exactly(tiny_config, tmp_path):
    """kill -9 after the step-2 checkpoint; the resumed run matches the uninterrupted one."""
    _, reference = full_run(tiny_config, tmp_path / "ref")
    expected = records(tmp_path / "ref")
    config = tiny_config("trainer.total_training_steps=4", "trainer.save_freq=2",
                         f"trainer.default_local_dir={tmp_path / 'kill'}", "trainer.val_before_train=false")
    proc = start_run_slow_at_step_3(config, tmp_path, stderr=subprocess.DEVNULL)
    latest = tmp_path / "kill" / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.time() + 120
    while not (latest.exists() and latest.read_text() == "2") and time.time() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert latest.read_text() == "2"
    resumed = build_trainer(config, progress_bar=False)
    assert resumed.global_step == 2
    resumed.fit()
    resumed.tracker.close()
    assert [stable(r) for r in records(tmp_path / "kill")] == [stable(r) for r in expected]
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(reference)))


def test_sigterm_saves_the_step_as_ctrl_c_does(tiny_config, tmp_path):
    """SIGTERM (timeout, Slurm, Kubernetes) stops `rlvr train` as Ctrl-C does: with no periodic
    saves (save_freq=-1), step 2 is saved when step 3 is cut short, the exit status is Ctrl-C's
    (130) with the resume hint, and the run resumes from step 2 (that such a save resumes
    exactly is test_ctrl_c_anywhere_resumes_to_the_uninterrupted_run's). Before, the process
    died at once (status -15) and lost both steps."""
    config = tiny_config("trainer.total_training_steps=4", "trainer.save_freq=-1",
                         f"trainer.default_local_dir={tmp_path / 'term'}", "trainer.val_before_train=false")
    proc = start_run_slow_at_step_3(config, tmp_path, stderr=subprocess.PIPE)
    metrics = tmp_path / "term" / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.exists() and '"step": 2' in metrics.read_text()) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # into step 3's wait
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "resume" in err and "Traceback" not in err
    assert latest_checkpoint(tmp_path / "term" / "checkpoints").name == "global_step_2"
    assert build_trainer(config, progress_bar=False).global_step == 2


def test_save_killed_midway_leaves_previous_checkpoint(tiny_config, tmp_path):
    config, trainer = full_run(tiny_config, tmp_path / "run", "trainer.total_training_steps=2", "trainer.save_freq=1")
    root = tmp_path / "run" / "checkpoints"
    assert latest_checkpoint(root).name == "global_step_2"
    original = trainer.wg.worker.save_checkpoint

    def dies_midway(folder):
        original(folder)
        raise KeyboardInterrupt  # e.g. killed before the rename

    trainer.wg.worker.save_checkpoint = dies_midway
    trainer._completed = trainer._snapshot(3)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_checkpoint()
    assert not (root / ".tmp-global_step_3").exists()  # an interrupt in this process discards its partial save
    assert latest_checkpoint(root).name == "global_step_2"
    assert build_trainer(config, progress_bar=False).global_step == 2


def test_checkpoint_is_a_transformers_folder_and_old_ones_are_pruned(tiny_config, tmp_path):
    from transformers import AutoModelForCausalLM

    _, trainer = full_run(tiny_config, tmp_path / "run", "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2")
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["global_step_3", "global_step_4"]
    model = AutoModelForCausalLM.from_pretrained(root / "global_step_4" / "actor")
    for a, b in zip(model.parameters(), trainer.wg.worker.actor.model.parameters()):
        assert torch.equal(a, b)


DAMAGE = {  # (file, how) -> what the message says of it
    ("actor/model.safetensors", "truncate"): "is truncated: {half} bytes where its header describes {size}",
    ("actor_state.pt", "truncate"): "is not a whole torch.save file",  # was: a zip reader error naming no file
    ("trainer_state.pt", "truncate"): "is not a whole torch.save file",  # was: OSError [Errno 22] Invalid argument
    ("actor_state.pt", "overwrite"): "is damaged: its entry",  # was: loaded, its moments NaN, without a word
}


def damage(path: Path, how: str) -> int:
    """Truncate ``path`` to half its size, or overwrite 64 bytes in its middle; -> its size before."""
    size = path.stat().st_size
    if how == "truncate":
        os.truncate(path, size // 2)
    else:
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\xff" * 64)
    return size


def test_a_damaged_checkpoint_names_its_file_and_the_newest_intact_one(tiny_config, tmp_path, capsys):
    """A checkpoint file truncated after its save (a full disk, a copy between machines) is refused
    before the model loads, naming the file and the newest earlier checkpoint whose files are
    whole; its remedy, moving the damaged folder aside, resumes from that one."""
    from rlvr.cli import main
    from rlvr.config import load_config, to_yaml

    config, _ = full_run(tiny_config, tmp_path / "run")  # checkpoints at steps 2 and 4
    (tmp_path / "config.yaml").write_text(to_yaml(config))
    for i, ((name, how), problem) in enumerate(DAMAGE.items()):
        run = tmp_path / f"copy{i}"
        shutil.copytree(tmp_path / "run", run)
        newest, intact = run / "checkpoints" / "global_step_4", run / "checkpoints" / "global_step_2"
        damaged = newest / name
        size = damage(damaged, how)
        argv = ["train", "--config", str(tmp_path / "config.yaml"), f"trainer.default_local_dir={run}"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"cannot resume from {newest}: {damaged} {problem.format(half=size // 2, size=size)}" in err, err
        assert f"The newest intact checkpoint is {intact} (steps 3-4 are trained again)" in err
        assert f"mv {newest} {run / 'checkpoints' / 'damaged-global_step_4'}" in err
        assert f"trainer.resume_mode={intact}" in err and "Traceback" not in err

    os.replace(newest, run / "checkpoints" / "damaged-global_step_4")  # as the message says
    resumed = build_trainer(load_config(str(tmp_path / "config.yaml"), [f"trainer.default_local_dir={run}"]),
                            progress_bar=False)
    assert resumed.global_step == 2
    resumed.tracker.close()

    os.truncate(intact / name, (intact / name).stat().st_size // 2)  # now none is intact
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"cannot resume from {intact}: {intact / name}" in err
    assert "No earlier checkpoint of this run is intact; start afresh with trainer.resume_mode=disable" in err


def test_incompatible_config_is_refused(tiny_config, tmp_path):
    full_run(tiny_config, tmp_path / "run", "trainer.total_training_steps=2")
    changed = tiny_config("trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path / 'run'}",
                          "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.n: checkpoint 3, this run 2"):
        build_trainer(changed, progress_bar=False)
    fresh = tiny_config("trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path / 'run'}",
                        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                        "trainer.resume_mode=disable")
    assert build_trainer(fresh, progress_bar=False).global_step == 0


@pytest.mark.slow  # a two-step run first: about 20 s
def test_a_resume_whose_batches_would_not_continue_the_run_is_refused_before_anything_changes(tiny_config, tmp_path):
    """Batches of another size (data.gen_batch_size, DAPO's) draw other prompts each step: refused
    with the reason, before the model loads and before the folder's config.yaml is rewritten (it
    was a ValueError traceback after both)."""
    full_run(tiny_config, tmp_path / "run", "trainer.total_training_steps=2")
    record = (tmp_path / "run" / "config.yaml").read_text()
    changed = tiny_config("trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path / 'run'}",
                          "data.gen_batch_size=4", "algorithm.filter_groups.enable=true")
    with pytest.raises(ConfigError, match=r"prompts a batch \(data.gen_batch_size.*\): checkpoint 2, this run 4"):
        build_trainer(changed, progress_bar=False)
    assert (tmp_path / "run" / "config.yaml").read_text() == record


CONSISTENT = ("trainer.total_training_steps=4", "trainer.save_freq=-1", "trainer.test_freq=2",
              "trainer.val_before_train=false", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
              "algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=1", "critic.ppo_micro_batch_size_per_gpu=3",
              "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=10",
              "algorithm.kl_ctrl.kl_coef=0.05", "algorithm.kl_ctrl.target_kl=0.001")


def critic_weights(trainer):
    return [p.detach().clone() for p in trainer.critic_wg.worker.model.parameters()]


WHERE = {  # (object, method, call) at which Ctrl-C lands
    "dump": lambda t: (t, "_dump_rollouts", 1),
    "validation": lambda t: (t, "validate", 1),
    "between": lambda t: (t.wg.worker.actor, "_optimizer_step", 2),  # after the first mini-batch's optimizer step
}


def test_ctrl_c_anywhere_resumes_to_the_uninterrupted_run(tiny_config, tmp_path, interrupt):
    """save_freq=-1: only Ctrl-C saves. Interrupts after step 2's update (in its validation), before
    step 2's update (in the rollout dump) and between step 3's mini-batches; each resume continues
    from one consistent step, and the run ends with the uninterrupted run's weights (actor and
    critic), adaptive KL coefficient and metrics."""
    reference = build_trainer(tiny_config(*CONSISTENT, f"trainer.default_local_dir={tmp_path / 'ref'}"),
                              progress_bar=False)
    reference.fit()
    reference.tracker.close()

    config = tiny_config(*CONSISTENT, f"trainer.default_local_dir={tmp_path / 'cut'}")
    expected_messages = [
        (2, "dump", r"interrupted after step 1; saved step 1"),
        (2, "validation", r"interrupted after step 2; saved step 2"),
        (3, "between", r"inside step 3's update.*nothing was saved; the last checkpoint, step 2, is kept"),
    ]
    for step, where, message in expected_messages:
        trainer = build_trainer(config, progress_bar=False)
        owner, name, call = WHERE[where](trainer)
        interrupt(trainer, owner, name, step, call)
        with pytest.raises(TrainingInterrupted, match=message):
            trainer.fit()
        trainer.tracker.close()
    resumed = build_trainer(config, progress_bar=False)
    assert resumed.global_step == 2  # the interrupt inside step 3's update kept step 2
    resumed.fit()
    resumed.tracker.close()
    got, expected = records(tmp_path / "cut"), records(tmp_path / "ref")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert [stable(r) for r in got] == [stable(r) for r in expected]
    assert "val-core/arithmetic/reward/mean@1" in got[1]  # step 2's validation ran after the resume
    assert resumed.kl_ctrl.value == reference.kl_ctrl.value != 0.05
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(reference)))
    assert all(torch.equal(a, b) for a, b in zip(critic_weights(resumed), critic_weights(reference)))


def test_ctrl_c_inside_the_first_update_saves_nothing(tiny_config, tmp_path, interrupt):
    config = tiny_config(*CONSISTENT, f"trainer.default_local_dir={tmp_path / 'run'}")
    trainer = build_trainer(config, progress_bar=False)
    interrupt(trainer, *WHERE["between"](trainer)[:2], 1, 2)
    with pytest.raises(TrainingInterrupted, match="inside step 1's update.*no checkpoint exists yet"):
        trainer.fit()
    trainer.tracker.close()
    assert latest_checkpoint(tmp_path / "run" / "checkpoints") is None


def test_resume_refuses_changed_seeds_and_mini_batches(tiny_config, tmp_path):
    full_run(tiny_config, tmp_path / "run", "trainer.total_training_steps=2")
    for change, message in (("trainer.seed=7", r"trainer.seed: checkpoint 1, this run 7"),
                            ("actor_rollout_ref.rollout.seed=5", r"rollout.seed: checkpoint 0, this run 5"),
                            ("actor_rollout_ref.actor.ppo_epochs=2", r"ppo_epochs: checkpoint 1, this run 2"),
                            ("actor_rollout_ref.actor.ppo_mini_batch_size=2", r"ppo_mini_batch_size: checkpoint 1")):
        changed = tiny_config("trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path / 'run'}", change)
        with pytest.raises(ConfigError, match=message):
            build_trainer(changed, progress_bar=False)
    # a key the synchronous run does not read (how many batches an async run queues) does not stop it
    unread = tiny_config("trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path / 'run'}",
                         "trainer.v1.colocate_async.num_warmup_batches=3")
    assert build_trainer(unread, progress_bar=False).global_step == 2


def test_resume_after_a_kill_mid_write_of_metrics(tiny_config, tmp_path):
    """kill -9 while a metrics line is written: the torn line is dropped and the run resumes."""
    config, _ = full_run(tiny_config, tmp_path / "run", "trainer.total_training_steps=2", "trainer.save_freq=1")
    path = tmp_path / "run" / "metrics.jsonl"
    path.write_text(path.read_text() + '{"step": 3, "critic/score/me')
    config = tiny_config("trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.val_before_train=false",
                         f"trainer.default_local_dir={tmp_path / 'run'}")
    resumed = build_trainer(config, progress_bar=False)
    resumed.fit()
    resumed.tracker.close()
    assert [r["step"] for r in records(tmp_path / "run")] == [1, 2, 3]


def test_stale_temporary_checkpoints_are_removed(tiny_config, tmp_path):
    root = tmp_path / "run" / "checkpoints"
    (root / ".tmp-global_step_7").mkdir(parents=True)
    (root / ".tmp-global_step_7" / "half.bin").write_bytes(b"x")
    full_run(tiny_config, tmp_path / "run", "trainer.total_training_steps=1", "trainer.save_freq=1")
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", "latest_checkpointed_iteration.txt"]


def test_every_file_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    from rlvr.trainer import checkpoint

    synced, events = set(), []
    real_fsync, real_replace = checkpoint._fsync, checkpoint.os.replace
    monkeypatch.setattr(checkpoint, "_fsync", lambda p: (synced.add(Path(p)), real_fsync(p)))

    def replace(src, dst):
        events.append((Path(src), {p for p in Path(src).rglob("*")} <= synced))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)

    def write_parts(folder):
        (folder / "actor").mkdir()
        (folder / "actor" / "model.safetensors").write_bytes(b"w")

    checkpoint.save(tmp_path, 3, write_parts, {"global_step": 3})
    folder_event = [ok for src, ok in events if src.name == ".tmp-global_step_3"]
    assert folder_event == [True]  # all files and folders synced before the folder was published
    assert tmp_path in synced and (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "3"


def test_checkpoint_with_other_weight_names_is_refused(tiny_config, tmp_path):
    from safetensors.torch import load_file, save_file

    from rlvr.models import ModelLoadError

    config, _ = full_run(tiny_config, tmp_path / "run", "trainer.total_training_steps=1", "trainer.save_freq=1")
    actor = tmp_path / "run" / "checkpoints" / "global_step_1" / "actor"
    stored = load_file(str(actor / "model.safetensors"))
    # the tied vocabulary projection is not stored (it is the embedding): that checkpoint loads
    assert "lm_head.weight" not in stored and build_trainer(config, progress_bar=False).global_step == 1
    stored["model.final_norm.weight"] = stored.pop("model.norm.weight")  # another model's name for the final norm
    save_file(stored, str(actor / "model.safetensors"), metadata={"format": "pt"})
    # before: from_pretrained initialised model.norm afresh, the unexpected name was dropped, and nothing was said
    with pytest.raises(ModelLoadError, match=rf"the weights in {actor} do not fit the model: missing 1 "
                                             r"\(model.norm.weight\), unexpected 1 \(model.final_norm.weight\)"):
        build_trainer(config, progress_bar=False)


def test_full_weights_of_other_names_are_refused_by_the_loader_itself(tiny_model_dir):
    from rlvr.distributed.fsdp import full_optimizer_state, load_full_state
    from rlvr.models import load_model

    model = load_model(tiny_model_dir)
    optimizer = torch.optim.AdamW(model.parameters())
    state = full_optimizer_state(None, model, optimizer)
    weights = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied to the embedding
    load_full_state(None, model, optimizer, weights, state)
    weights["model.final_norm.weight"] = weights.pop("model.norm.weight")
    # (this API reports no missing names under strict=False: check_weight_names, called first, does)
    with pytest.raises(ValueError, match=r"do not fit the model: .* unexpected \['model.final_norm.weight'\]"):
        load_full_state(None, model, optimizer, weights, state)


@pytest.fixture
def rollout_pool_of_its_own(monkeypatch):
    """``hybrid_engine=false``'s synchronous path in one process: the rollout on a ``RolloutWorker``
    of its own (a Ray pool's stand-in; the weights reach it by copy instead of broadcast), sent the
    actor's weights with their version after every update and on resume."""
    import rlvr.trainer.main as main
    from rlvr.distributed.worker_group import LocalWorkerGroup
    from rlvr.workers.rollout import RolloutWorker

    build = main.local_worker_groups

    def with_pool(config, steps, tokenizer, tool_setup, run_dir):
        actor, critic, _ = build(config, steps, tokenizer, tool_setup, run_dir)
        pool = RolloutWorker(config, tokenizer, tool_setup)
        pool.init_model()
        return actor, critic, LocalWorkerGroup(pool)

    monkeypatch.setattr(main, "local_worker_groups", with_pool)


def test_a_synchronous_run_with_a_rollout_pool_of_its_own_resumes(tiny_config, tmp_path, interrupt_and_resume,
                                                                   rollout_pool_of_its_own):
    """A resume sends the pool the checkpoint's weights as version 1 (the steps they hold), not 0:
    step 2's samples are stamped 1, as the uninterrupted run's, and the version check passes.
    Failed before the fix: the weights were sent while global_step was still 0, and step 2 stopped
    with "generated 6 of 6 samples with weight version 0, but it was sent version 1"."""
    two_steps = ("trainer.total_training_steps=2", "trainer.save_freq=1")
    _, reference = full_run(tiny_config, tmp_path / "ref", *two_steps)
    assert reference.rollout_wg is not reference.wg  # the pool of its own is in use
    config = tiny_config(*two_steps, f"trainer.default_local_dir={tmp_path / 'cut'}", "trainer.val_before_train=false")
    resumed = interrupt_and_resume(build_trainer(config, progress_bar=False), 2, "step 1 was already saved")
    assert resumed.rollout_wg.worker.version == 2  # sent after update 2
    got = records(tmp_path / "cut")
    assert [r["step"] for r in got] == [1, 2]
    assert [stable(r) for r in got] == [stable(r) for r in records(tmp_path / "ref")]
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(reference)))
    step_2 = [json.loads(line) for line in open(tmp_path / "cut" / "rollouts" / "2.jsonl")]
    assert {row["policy_version"] for row in step_2} == {1}
