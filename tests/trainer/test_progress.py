"""A long step shows what it is doing: its phase (generating n/N rows, scoring, log-probs,
updating mini-batch k/K, saving) with the phase's clock, on the bar and, where stdout is not a
terminal (nohup), as plain lines at a bounded rate. The bar once sat at 0/N [00:00<?] for a whole
step, and a log showed nothing until the step line (issue 47, §4)."""

import re

import numpy as np
import torch

from rlvr.progress import advance, listening
from rlvr.trainer import progress as progress_module
from rlvr.trainer.main import build_trainer
from rlvr.trainer.progress import StepProgress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_log_gets_the_phase_after_quiet_s_each_change_then_a_line_every_every_s():
    """Plain lines, driven by hand (a fake clock, the ticks called directly): nothing before
    QUIET_S (5 s), then the phase with its count, each phase change at once, and a phase that
    runs on once per EVERY_S (15 s) of it, never per count."""
    lines, clock = [], Clock()
    progress = StepProgress(plain=True, write=lines.append, clock=clock)
    progress.start_step(3)
    with listening(progress._count):
        progress.phase("gen")
        advance("rows", 12, 48)
        clock.now += 4.0
        progress._tick()
        assert lines == []  # 4 s < QUIET_S: a short step prints only its step line
        clock.now += 1.0
        progress._tick()  # 5 s
        advance("rows", 20, 48)
        advance("mini-batch", 1, 4)  # another unit (an engine ahead, say): not this phase's count
        clock.now += 14.0
        progress._tick()  # 14 s after the last line: not yet
        clock.now += 1.0
        progress._tick()  # 15 s
        progress.phase("reward")  # a change: at once
        progress.phase("update_actor")
        advance("mini-batch", 2, 4)
        clock.now += 15.0
        progress._tick()
    progress.end_step()
    progress._tick()  # between steps: nothing
    assert lines == [
        "[rlvr] step 3: generating 12/48 rows (5 s; step 5 s)",
        "[rlvr] step 3: generating 20/48 rows (20 s; step 20 s)",
        "[rlvr] step 3: scoring (0 s; step 20 s)",
        "[rlvr] step 3: updating (0 s; step 20 s)",
        "[rlvr] step 3: updating mini-batch 2/4 (15 s; step 35 s)",
    ]


def test_the_bar_shows_the_phase_and_its_clock(capsys):
    from tqdm import tqdm

    clock = Clock()
    bar = tqdm(total=4, desc="training", unit="step")
    progress = StepProgress(bar, plain=False, clock=clock, live_bar=True)  # as on a terminal
    progress.start_step(1)
    with listening(progress._count):
        progress.phase("gen")
        advance("rows", 5, 6)
        clock.now += 7.0
        progress._tick()
    progress.end_step()
    progress.close()
    bar.close()
    err = capsys.readouterr().err
    assert "training · step 1: generating 5/6 rows (7 s; step 7 s)" in err, err


def test_a_bar_written_to_a_log_is_not_redrawn_every_tick(capsys):
    """Under nohup the bar's file is a log: a redraw a second wrote ~100 bytes a second of bar into
    it (seen in a 24-step default job's log). There the phase waits for the bar's own update."""
    from tqdm import tqdm

    clock = Clock()
    bar = tqdm(total=4, desc="training", unit="step", mininterval=0)
    progress = StepProgress(bar, plain=False, clock=clock)  # capsys: the bar's file is not a terminal
    capsys.readouterr()  # the bar's first draw
    progress.start_step(1)
    progress.phase("gen")
    for _ in range(5):
        clock.now += 1.0
        progress._tick()
    assert capsys.readouterr().err == "", "the bar was redrawn into a file"
    progress.close()
    bar.update()  # the bar's own update shows the phase
    assert "step 1: generating" in capsys.readouterr().err


def test_a_run_logged_to_a_file_shows_each_phase_of_its_steps_in_order(tiny_config, monkeypatch, capsys):
    """stdout captured (not a terminal), QUIET_S 0 so the tiny model's short steps print: each
    step logs generating, scoring, old log-probs, ref log-probs, advantages, writing rollouts (the
    recipe's rollout_data_dir), updating, then the checkpoint's saving, in the step's order,
    before the step's line."""
    monkeypatch.setattr(progress_module, "QUIET_S", 0.0)
    config = tiny_config("trainer.total_training_steps=1", "trainer.save_freq=1", "trainer.val_before_train=false",
                         "trainer.test_freq=-1", "trainer.logger=[console]")
    trainer = build_trainer(config, progress_bar=False)
    trainer.fit()
    trainer.tracker.close()
    out = capsys.readouterr().out
    phases = re.findall(r"\[rlvr\] step 1: ([a-z -]+?)(?: [\d/]+ rows| mini-batch [\d/]+)? \(", out)
    assert phases == ["generating", "scoring", "old log-probs", "ref log-probs", "advantages", "writing rollouts",
                      "updating", "saving"], out
    assert out.index("step 1: saving") < out.index("step 1 | reward")  # the console logger's step line


def test_the_engine_counts_its_finished_rows(tiny_config):
    """The native engine reports rows finished as they finish, up to all of them, across waves of
    max_num_seqs (2 rows per wave here: 6 rows in 3 waves)."""
    config = tiny_config("actor_rollout_ref.rollout.max_num_seqs=3", "trainer.val_before_train=false")
    trainer = build_trainer(config, progress_bar=False)
    batch = next(iter(trainer.loader))
    _, gen_batch = trainer._dispatch(batch, 1, 0)
    counts = []
    with listening(lambda unit, done, total: counts.append((unit, done, total))):
        trainer.rollout_wg.generate_sequences(gen_batch)
    trainer.tracker.close()
    assert {unit for unit, _, _ in counts} == {"rows"} and {total for _, _, total in counts} == {6}
    done = [d for _, d, _ in counts]
    assert done == sorted(done) and done[-1] == 6
    # waves of whole groups (n = 3) under max_num_seqs = 3: the first wave's 3 rows are done before the second starts
    assert 3 in done


def test_eval_shows_the_rows_generated_within_a_batch(capsys, monkeypatch):
    """One batch of 4 prompts whose generation takes ~1.5 s: while it generates, the bar shows
    the engine's count of finished rows, not only a clock."""
    import time

    from rlvr.protocol import DataProto
    from rlvr.rewards.manager import RewardResult
    from rlvr.trainer import evaluate as evaluate_module

    class Dataset:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

        def collate(self, rows):
            return DataProto.from_dict({"input_ids": torch.zeros(len(rows), 2, dtype=torch.long),
                                        "attention_mask": torch.ones(len(rows), 2, dtype=torch.long),
                                        "position_ids": torch.zeros(len(rows), 2, dtype=torch.long)},
                                       {"data_source": np.array(["x"] * len(rows), dtype=object)})

    def generate(gen):
        for done in range(1, len(gen) + 1):
            advance("rows", done, len(gen))
            time.sleep(0.4)
        rows = len(gen)
        return DataProto.from_dict({"responses": torch.zeros(rows, 1, dtype=torch.long),
                                    "response_mask": torch.ones(rows, 1, dtype=torch.long)})

    class Tokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return "x"

    def reward_fn(batch):
        return RewardResult(torch.zeros(len(batch), 1))

    monkeypatch.setattr(evaluate_module, "validation_metrics", lambda *args: {})
    evaluate_module.evaluate(generate, reward_fn, Dataset(), Tokenizer(), 1, {}, progress="eval")
    err = capsys.readouterr().err
    assert re.search(r"0/4 \[.*generating [23]/4 rows", err), err
