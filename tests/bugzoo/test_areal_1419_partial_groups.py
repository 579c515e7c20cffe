"""AReaL #1419: a filter dropped single rows, so groups reached GRPO's normalisation with fewer
samples than n, and each was normalised over the wrong mean and std, silently. In rlvr every
group must have ``rollout.n`` rows when its advantages are computed (rows left out of the
update stay in the batch, masked), or the run stops, naming the groups.

Fails when the ``check_groups`` call in ``RLTrainer._advantages`` is removed.
"""

import numpy as np
import pytest
import torch

import rlvr.trainer.ppo_trainer as ppo_trainer
from rlvr.errors import StopTraining
from rlvr.trainer.main import build_trainer
from rlvr.trainer.guards import check_groups


def test_whole_groups_pass_and_a_short_or_long_group_is_named():
    check_groups(np.array(["a", "a", "b", "b"], dtype=object), 2, step=1)
    with pytest.raises(StopTraining, match=r"step 5: 2 of 3 groups do not have actor_rollout_ref.rollout.n = 2 rows "
                                           r"before their advantages \('b': 1 rows, 'c': 3 rows\)"):
        check_groups(np.array(["a", "a", "b", "c", "c", "c"], dtype=object), 2, step=5)


def test_a_filter_that_drops_single_rows_stops_the_run(tiny_config, tmp_path, monkeypatch):
    """Dynamic sampling with a filter that keeps rows, not groups (here: drops each batch's first
    row): the batch handed on (the first train_batch_size = 2 groups kept) has a group of n - 1 = 2
    rows. Unchecked, GRPO would give it a baseline over 2 samples."""
    def drop_first_row(index, metric):
        keep = torch.ones(len(index), dtype=torch.bool)
        keep[0] = False
        return keep

    monkeypatch.setattr(ppo_trainer, "filter_groups", drop_first_row)
    config = tiny_config("algorithm.filter_groups.enable=true", "trainer.val_before_train=false", "data.val_files=[]",
                         f"trainer.default_local_dir={tmp_path}")
    trainer = build_trainer(config, progress_bar=False)
    with pytest.raises(StopTraining, match=r"step 1: 1 of 2 groups do not have actor_rollout_ref.rollout.n = 3 rows"):
        trainer.fit()
    trainer.tracker.close()


def test_a_group_of_split_episodes_counts_episodes_not_rows():
    """An agent's episode in several samples (rows 0-1: episode 0; rows 2-3: 1, 2): group a has n = 2
    episodes in 3 rows and passes; counting rows, it would be stopped. Group b short of an episode
    is still named."""
    episodes = np.array([0, 0, 1, 2, 3])
    check_groups(np.array(["a", "a", "a", "b", "b"], dtype=object), 2, step=1, episodes=episodes)
    with pytest.raises(StopTraining, match=r"\('b': 1 episodes\)"):
        check_groups(np.array(["a", "a", "a", "b", "b"], dtype=object), 2, step=1, episodes=np.array([0, 0, 1, 2, 2]))


def test_groups_are_counted_by_uid_value_as_the_estimators_group():
    """uid 1 (int) and "1" (str) are two groups, as the advantage estimators (and verl's dict of
    uids) take them: two rows each pass at n = 2; one row each is two short groups, named."""
    check_groups(np.array([1, "1", 1, "1"], dtype=object), 2, step=1)
    with pytest.raises(StopTraining, match=r"step 1: 2 of 2 groups do not have actor_rollout_ref.rollout.n = 2 rows "
                                           r"before their advantages \(1: 1 rows, '1': 1 rows\)"):
        check_groups(np.array([1, "1"], dtype=object), 2, step=1)
