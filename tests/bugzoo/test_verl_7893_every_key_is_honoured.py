"""verl #7893 (https://github.com/verl-project/verl/pull/7893): with adv_estimator=grpo_vectorized,
algorithm.norm_adv_by_std_in_grpo=False still divided by the group std, because the trainer's
dispatch did not forward the flag and the estimator fell back to its default.

Here every advantage estimator rlvr registers is run the way the trainer runs it
(``compute_advantage(batch, config.algorithm)``), and each algorithm key it reads moves its output
to a hand-computed value. A new estimator, or a new key read by one, fails the first two tests
until it is covered here.
"""

import numpy as np
import pytest
import torch

from rlvr.algos import ADV_ESTIMATORS, compute_advantage
from rlvr.config.schema import AlgorithmConfig
from rlvr.protocol import DataProto

# the algorithm keys each of rlvr's estimators reads, each covered by a case in CASES below
KEYS = {
    "grpo": {"norm_adv_by_std_in_grpo"},
    "grpo_passk": {"norm_adv_by_std_in_grpo"},
    "reinforce_plus_plus": {"gamma"},
    "gae": {"gamma", "lam"},
    "rloo": set(), "opo": set(), "reinforce_plus_plus_baseline": set(), "remax": set(),
    "grpo_vectorized": {"norm_adv_by_std_in_grpo"}, "rloo_vectorized": set(), "gpg": set(),
}


class ReadKeys:
    """The algorithm config, recording which of its keys are read."""

    def __init__(self, config):
        self._config, self.read = config, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._config, name)


def batch(scores, values=None, length=3):
    """One response of ``length`` tokens per score, the score on its last token, groups of 3."""
    rewards = torch.zeros(len(scores), length)  # (bs, T)
    rewards[:, -1] = torch.tensor(scores)
    tensors = {"token_level_rewards": rewards, "response_mask": torch.ones(len(scores), length),
               "values": values if values is not None else torch.zeros(len(scores), length),
               "reward_baselines": torch.full((len(scores),), 0.5)}
    uids = np.array([f"g{i // 3}" for i in range(len(scores))], dtype=object)
    return DataProto.from_dict(tensors, {"uid": uids})


def test_every_registered_estimator_is_covered():
    """fails when an estimator is registered in rlvr without an entry in KEYS (and a case for each
    key it reads)."""
    # rlvr's own: a ``custom_modules`` file (imported as rlvr_custom_<digest>) or a
    # test may have registered more in this process
    own = {name for name in ADV_ESTIMATORS.names() if ADV_ESTIMATORS.get(name).__module__.startswith("rlvr.")}
    assert own == set(KEYS)


@pytest.mark.parametrize("name", sorted(KEYS))
def test_each_estimator_reads_exactly_the_keys_covered_here(name):
    """fails when an estimator reads a key that no case below changes (or stops reading one)."""
    config = ReadKeys(AlgorithmConfig(adv_estimator=name))
    compute_advantage(batch([0.0, 2.0, 4.0, 1.0, 1.0, 3.0]), config)
    assert config.read - {"adv_estimator"} == KEYS[name]


# (estimator, algorithm keys, scores, which output, its expected value on every row's tokens)
CASES = [
    # group [0, 2, 4]: mean 2, unbiased std sqrt((4 + 0 + 4) / 2) = 2
    ("grpo", {"norm_adv_by_std_in_grpo": True}, [0.0, 2.0, 4.0], "advantages", [[-1.0] * 3, [0.0] * 3, [1.0] * 3]),
    ("grpo", {"norm_adv_by_std_in_grpo": False}, [0.0, 2.0, 4.0], "advantages", [[-2.0] * 3, [0.0] * 3, [2.0] * 3]),
    # only the best (4) gets best - second best = 4 - 2 = 2, divided by the std 2 or not
    ("grpo_passk", {"norm_adv_by_std_in_grpo": True}, [0.0, 2.0, 4.0], "advantages", [[0.0] * 3, [0.0] * 3, [1.0] * 3]),
    ("grpo_passk", {"norm_adv_by_std_in_grpo": False}, [0.0, 2.0, 4.0], "advantages", [[0.0] * 3, [0.0] * 3, [2.0] * 3]),
    # returns G_t = gamma^(2 - t) * 1 for the score 1 on the last of 3 tokens
    ("reinforce_plus_plus", {"gamma": 1.0}, [1.0], "returns", [[1.0, 1.0, 1.0]]),
    ("reinforce_plus_plus", {"gamma": 0.5}, [1.0], "returns", [[0.25, 0.5, 1.0]]),
    # as grpo: mean 2, std 2 (above the 1e-3 floor); (s - 2) / (2 + 1e-6), or s - 2
    ("grpo_vectorized", {"norm_adv_by_std_in_grpo": True}, [0.0, 2.0, 4.0], "advantages",
     [[-1.0] * 3, [0.0] * 3, [1.0] * 3]),
    ("grpo_vectorized", {"norm_adv_by_std_in_grpo": False}, [0.0, 2.0, 4.0], "advantages",
     [[-2.0] * 3, [0.0] * 3, [2.0] * 3]),
]


@pytest.mark.parametrize("name, keys, scores, output, expected", CASES,
                         ids=[f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[1].items())}" for c in CASES])
def test_an_estimator_honours_its_keys(name, keys, scores, output, expected):
    """fails when compute_advantage stops passing ``config`` to the estimator, or an estimator
    reads its default instead of the key (``_option`` in rlvr/algos/advantages.py)."""
    data = compute_advantage(batch(scores), AlgorithmConfig(adv_estimator=name, **keys))
    # eps 1e-6 in the std: 2 / (2 + 1e-6) is 1 to within 5e-7
    torch.testing.assert_close(data.batch[output], torch.tensor(expected), atol=1e-6, rtol=0)


@pytest.mark.parametrize("gamma, lam, first_return", [(1.0, 1.0, 1.0), (0.5, 1.0, 0.5), (1.0, 0.5, 0.75)])
def test_gae_honours_gamma_and_lam(gamma, lam, first_return):
    """fails when gae reads the default gamma or lam (1.0) instead of the key.

    Two tokens, reward 1 on the last, values 0.5 and 0.5:
    t=1: delta = 1 + gamma * 0 - 0.5 = 0.5, A_1 = 0.5, return 0.5 + 0.5 = 1
    t=0: delta = 0 + gamma * 0.5 - 0.5, A_0 = delta + gamma * lam * 0.5,
         return A_0 + 0.5 = 0.5 * gamma * (1 + lam): 1.0, 0.5 (gamma 0.5), 0.75 (lam 0.5)."""
    data = batch([1.0], values=torch.tensor([[0.5, 0.5]]), length=2)
    compute_advantage(data, AlgorithmConfig(adv_estimator="gae", gamma=gamma, lam=lam))
    torch.testing.assert_close(data.batch["returns"], torch.tensor([[first_return, 1.0]]), atol=1e-6, rtol=0)
