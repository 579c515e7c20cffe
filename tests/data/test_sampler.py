import numpy as np
import pytest

from rlvr.data import ResumableSampler


def take(sampler, k):
    out = []
    while len(out) < k:
        for batch in sampler.iter_epoch():
            out.append(batch.tolist())
            if len(out) == k:
                break
    return out


def test_same_seed_same_order_and_epochs_differ():
    a, b = ResumableSampler(10, 3, seed=5), ResumableSampler(10, 3, seed=5)
    assert take(a, 6) == take(b, 6)
    first, second = ResumableSampler(10, 3, seed=5).epoch_order(0), ResumableSampler(10, 3, seed=5).epoch_order(1)
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, ResumableSampler(10, 3, seed=6).epoch_order(0))


def test_epoch_covers_rows_once_and_drops_last():
    s = ResumableSampler(10, 3, seed=0)
    batches = list(s.iter_epoch())
    flat = [i for b in batches for i in b]
    assert len(batches) == 3 and len(set(flat)) == 9  # 10 // 3 = 3 batches, one row left over
    assert s.epoch == 1 and s.offset == 0


def test_no_shuffle_is_in_order():
    assert take(ResumableSampler(6, 2, shuffle=False), 3) == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.parametrize("stop_after", [1, 3, 4, 7])
def test_resume_neither_repeats_nor_skips(stop_after):
    # 10 rows, batches of 3 -> 3 batches per epoch; stopping after 3 lands on an epoch boundary
    reference = take(ResumableSampler(10, 3, seed=9), 9)
    first = ResumableSampler(10, 3, seed=9)
    got = take(first, stop_after)
    state = first.state_dict()
    resumed = ResumableSampler(10, 3, seed=9)
    resumed.load_state_dict(state)
    got += take(resumed, 9 - stop_after)
    assert got == reference


def test_resume_refuses_a_different_dataset():
    state = ResumableSampler(10, 3).state_dict()
    with pytest.raises(ValueError, match="saved num_rows is 10 but this run's is 12"):
        ResumableSampler(12, 3).load_state_dict(state)


def test_too_few_rows_for_a_batch():
    with pytest.raises(ValueError, match="2 rows, fewer than one batch of 4"):
        ResumableSampler(2, 4)
