"""Advantage estimators against hand-computed values, a plain-loop reference, and invariances."""

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from rlvr.algos import ADV_ESTIMATORS, compute_advantage, get_adv_estimator_fn, register_adv_est
from rlvr.config.schema import AlgorithmConfig
from rlvr.protocol import DataProto

# Two groups: "a" = scores [1, 0] and "b" = scores [2, 4, 6]; the score sits on the last valid token.
INDEX = np.array(["a", "a", "b", "b", "b"], dtype=object)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
SCORES = torch.tensor([1.0, 0.0, 2.0, 4.0, 6.0])


def rewards_on_last_token(scores=SCORES, mask=MASK):
    rewards = torch.zeros_like(mask)
    last = mask.sum(dim=1).long() - 1
    rewards[torch.arange(len(scores)), last] = scores
    return rewards


def run(name, **kw):
    kw.setdefault("token_level_rewards", rewards_on_last_token())
    kw.setdefault("response_mask", MASK)
    kw.setdefault("index", INDEX)
    return get_adv_estimator_fn(name)(**kw)


def per_sample(adv, mask=MASK):
    """The advantage of each sample, checking it is constant over its valid tokens and 0 elsewhere."""
    first = adv[:, 0]
    assert torch.allclose(adv, first[:, None] * mask, atol=1e-6)
    return first


def test_grpo_two_groups():
    adv, ret = run("grpo")
    # a: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.70711 -> +-0.5 / 0.70711 = +-0.70711
    # b: mean 4, std sqrt((4 + 0 + 4) / 2) = 2 -> (-2, 0, 2) / 2 = (-1, 0, 1)
    expected = torch.tensor([0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6),
                             -2 / (2 + 1e-6), 0.0, 2 / (2 + 1e-6)])
    assert torch.allclose(per_sample(adv), expected, atol=1e-6)
    assert torch.equal(adv, ret)


def test_grpo_scores_near_the_reward_bound_keep_their_advantages():
    """Two scores of +-1.5e19 (inside the reward manager's +-1.8e19 bound): their squared deviations
    (4.5e38) pass float32's range, which made the group std inf and both advantages 0. In float64:
    mean 0, std sqrt((2.25e38 + 2.25e38) / 1) = 2.1213e19 -> +-1.5e19 / 2.1213e19 = +-0.70711."""
    scores = torch.tensor([1.5e19, -1.5e19, 2.0, 4.0, 6.0])
    adv, _ = run("grpo", token_level_rewards=rewards_on_last_token(scores))
    assert torch.allclose(per_sample(adv)[:2], torch.tensor([math.sqrt(0.5), -math.sqrt(0.5)]), atol=1e-6)


def test_dr_grpo_skips_std():
    adv, _ = run("grpo", norm_adv_by_std_in_grpo=False)
    # a: 1 - 0.5, 0 - 0.5; b: 2 - 4, 4 - 4, 6 - 4
    assert torch.allclose(per_sample(adv), torch.tensor([0.5, -0.5, -2.0, 0.0, 2.0]))
    # the option may also come from the algorithm config
    adv_cfg, _ = run("grpo", config=AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    assert torch.equal(adv, adv_cfg)


def test_grpo_group_of_one_uses_mean_0_std_1():
    adv, _ = run("grpo", token_level_rewards=torch.tensor([[0.0, 3.0]]), response_mask=torch.ones(1, 2),
                 index=np.array(["c"], dtype=object))
    # mean 0, std 1: 3 / (1 + 1e-6)
    assert torch.allclose(adv, torch.tensor([[3.0, 3.0]]) / (1 + 1e-6))


def test_grpo_passk():
    adv, _ = run("grpo_passk")
    # a: best is row 0 (1), second 0 -> gap 1 / std 0.70711 = 1.41421; row 1 gets 0
    # b: best is row 4 (6), second 4 -> gap 2 / std 2 = 1; rows 2, 3 get 0
    expected = torch.tensor([1 / (math.sqrt(0.5) + 1e-6), 0, 0, 0, 2 / (2 + 1e-6)])
    assert torch.allclose(per_sample(adv), expected, atol=1e-6)
    adv, _ = run("grpo_passk", norm_adv_by_std_in_grpo=False)
    assert torch.allclose(per_sample(adv), torch.tensor([1.0, 0, 0, 0, 2.0]))


def test_grpo_passk_ties_and_group_of_one():
    # tie in group a: both score 1 -> the first row is the best, gap 0
    scores = torch.tensor([1.0, 1.0, 2.0, 4.0, 6.0])
    adv, _ = run("grpo_passk", token_level_rewards=rewards_on_last_token(scores))
    assert per_sample(adv)[:2].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="at least 2 samples per group"):
        run("grpo_passk", index=np.array(["a", "a", "b", "b", "c"], dtype=object))


def test_rloo():
    adv, _ = run("rloo")
    # a: 1 - 0 = 1, 0 - 1 = -1; b: 2 - (4+6)/2 = -3, 4 - (2+6)/2 = 0, 6 - (2+4)/2 = 3
    assert torch.allclose(per_sample(adv), torch.tensor([1.0, -1.0, -3.0, 0.0, 3.0]))
    single, _ = run("rloo", token_level_rewards=torch.tensor([[0.0, 3.0]]), response_mask=torch.ones(1, 2),
                    index=np.array(["c"], dtype=object))
    assert torch.allclose(single, torch.tensor([[3.0, 3.0]]))  # no baseline for a group of one


def test_opo_length_weighted_baseline():
    adv, _ = run("opo")
    # a: lengths (3, 1): baseline (3*1 + 1*0) / 4 = 0.75 -> 0.25, -0.75
    # b: lengths (2, 3, 1): baseline (2*2 + 3*4 + 1*6) / 6 = 22/6 -> 2 - 22/6, 4 - 22/6, 6 - 22/6
    b = 22 / 6
    assert torch.allclose(per_sample(adv), torch.tensor([0.25, -0.75, 2 - b, 4 - b, 6 - b]))


def test_reinforce_plus_plus_discounted_and_whitened():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, returns = run("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    # gamma 0.5: row 0 returns (0.25, 0.5, 1); row 1 (0.5, 1, 0 [padding])
    assert torch.allclose(returns, torch.tensor([[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]]))
    # masked values 0.25, 0.5, 1, 0.5, 1: mean 0.65; squared deviations sum 0.45; unbiased var 0.45/4 = 0.1125
    std = math.sqrt(0.1125 + 1e-8)
    expected = torch.tensor([[-0.4, -0.15, 0.35], [-0.15, 0.35, 0.0]]) / std
    assert torch.allclose(adv, expected, atol=1e-5)


def test_reinforce_plus_plus_baseline():
    adv, _ = run("reinforce_plus_plus_baseline", response_mask=torch.ones(5, 1),
                 token_level_rewards=SCORES[:, None])
    # group-centred: (0.5, -0.5, -2, 0, 2); mean 0, unbiased var (0.25+0.25+4+0+4)/4 = 2.125
    expected = torch.tensor([0.5, -0.5, -2.0, 0.0, 2.0]) / math.sqrt(2.125 + 1e-8)
    assert torch.allclose(adv[:, 0], expected, atol=1e-6)


def test_remax():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, returns = run("remax", token_level_rewards=rewards, response_mask=mask,
                       reward_baselines=torch.tensor([0.5, 1.0]))
    # returns-to-go: (1, 1, 1), (2, 2, 0); minus the greedy baselines 0.5 and 1 on valid tokens
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    assert torch.allclose(adv, torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="reward_baselines"):
        run("remax")


def test_gae_returns_and_whitening():
    rewards, values, mask = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.ones(1, 3)
    adv, returns = run("gae", token_level_rewards=rewards, response_mask=mask, values=values, gamma=1.0, lam=1.0)
    # deltas: t2 = 1 - 0.7 = 0.3; t1 = 0.7 - 0.6 = 0.1; t0 = 0.6 - 0.5 = 0.1
    # gae: t2 0.3, t1 0.4, t0 0.5; returns = gae + values = 1, 1, 1
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0, 1.0]]))
    # whitened: mean 0.4, unbiased var (0.01 + 0 + 0.01)/2 = 0.01 -> (1, 0, -1)
    assert torch.allclose(adv, torch.tensor([[1.0, 0.0, -1.0]]), atol=1e-5)
    _, returns = run("gae", token_level_rewards=rewards, response_mask=mask, values=values, gamma=0.9, lam=0.5)
    # t2: delta 0.3, gae 0.3; t1: delta 0.9*0.7 - 0.6 = 0.03, gae 0.03 + 0.45*0.3 = 0.165
    # t0: delta 0.9*0.6 - 0.5 = 0.04, gae 0.04 + 0.45*0.165 = 0.11425; returns = gae + values
    assert torch.allclose(returns, torch.tensor([[0.61425, 0.765, 1.0]]), atol=1e-6)


def test_gae_skips_masked_positions():
    # a masked (tool-output) token in the middle passes value and advantage through
    rewards, values = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.7]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    _, returns = run("gae", token_level_rewards=rewards, response_mask=mask, values=values, gamma=1.0, lam=1.0)
    # t2: gae 0.3; t1 masked: carries gae 0.3, next value 0.7; t0: delta 0.7 - 0.5 = 0.2, gae 0.5
    assert torch.allclose(returns[0, [0, 2]], torch.tensor([1.0, 1.0]))


# ------------------------------------------------------------------ uids group by value, as verl's dict of them
# Rows 0, 2 have uid 1 (int), rows 1, 3 uid "1" (str): two groups, 1 -> scores (1, 0) and "1" -> (2, 4),
# one token each. Cast to str, the uids made one group of four, scores (1, 2, 0, 4): mean 1.75.
MIXED_INDEX = np.array([1, "1", 1, "1"], dtype=object)
MIXED_SCORES = torch.tensor([1.0, 2.0, 0.0, 4.0])
S2 = math.sqrt(0.5) + 1e-6  # group 1: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1)
S4 = math.sqrt(2.0) + 1e-6  # group "1": mean 3, unbiased std sqrt((1 + 1) / 1)
MIXED_EXPECTED = {
    # (score - group mean) / (group std + eps): (0.5 / S2, -1 / S4, -0.5 / S2, 1 / S4) = (0.7071, -0.7071, ...)
    "grpo": [0.5 / S2, -1.0 / S4, -0.5 / S2, 1.0 / S4],
    # Dr.GRPO: score - group mean
    "dr_grpo": [0.5, -1.0, -0.5, 1.0],
    # best of each group gets (best - second) / std: row 0 (1 - 0) / S2, row 3 (4 - 2) / S4; one group: row 3 only
    "grpo_passk": [1.0 / S2, 0.0, 0.0, 2.0 / S4],
    # score minus the other sample of its group: 1 - 0, 2 - 4, 0 - 1, 4 - 2
    "rloo": [1.0, -2.0, -1.0, 2.0],
    # equal lengths: the length-weighted mean is the group mean
    "opo": [0.5, -1.0, -0.5, 1.0],
    # group-centred (0.5, -1, -0.5, 1): mean 0, unbiased var (0.25 + 1 + 0.25 + 1) / 3 = 5/6
    "reinforce_plus_plus_baseline": [v / math.sqrt(5 / 6 + 1e-8) for v in (0.5, -1.0, -0.5, 1.0)],
}


@pytest.mark.parametrize("name", sorted(MIXED_EXPECTED))
def test_an_int_uid_and_its_str_are_two_groups(name):
    options = {"norm_adv_by_std_in_grpo": False} if name == "dr_grpo" else {}
    adv, _ = run("grpo" if name == "dr_grpo" else name, token_level_rewards=MIXED_SCORES[:, None],
                 response_mask=torch.ones(4, 1), index=MIXED_INDEX, **options)
    assert torch.allclose(adv[:, 0], torch.tensor(MIXED_EXPECTED[name]), atol=1e-5)


def test_an_int_uid_and_its_str_are_two_singletons():
    # rewards (1, 0), uids (1, "1"): two groups of one, each mean 0 and std 1 -> (1 / (1 + 1e-6), 0); as one
    # group of two they were (0.5, -0.5) / 0.7071 = (0.7071, -0.7071)
    adv, _ = run("grpo", token_level_rewards=torch.tensor([[1.0], [0.0]]), response_mask=torch.ones(2, 1),
                 index=np.array([1, "1"], dtype=object))
    assert torch.allclose(adv[:, 0], torch.tensor([1 / (1 + 1e-6), 0.0]))


# ------------------------------------------------------------------ equivalence with plain loops
def loop_grpo(scores, index, norm=True, eps=1e-6):
    groups = defaultdict(list)
    for i, uid in enumerate(index):
        groups[uid].append(scores[i])
    out = scores.clone()
    for i, uid in enumerate(index):
        g = torch.stack(groups[uid])
        mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if len(g) == 1 else (g.mean(), g.std())
        out[i] = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
    return out


def loop_rloo(scores, index):
    out = scores.clone()
    for i, uid in enumerate(index):
        others = [scores[j] for j, u in enumerate(index) if u == uid and j != i]
        if others:
            out[i] = scores[i] - torch.stack(others).mean()
    return out


def loop_opo(scores, lengths, index):
    out = scores.clone()
    for i, uid in enumerate(index):
        members = [j for j, u in enumerate(index) if u == uid]
        if len(members) > 1:
            out[i] = scores[i] - sum(lengths[j] * scores[j] for j in members) / sum(lengths[j] for j in members)
    return out


def random_batch(seed, bs=24, T=7):
    g = torch.Generator().manual_seed(seed)
    index = np.array([f"g{int(i)}" for i in torch.randint(0, 6, (bs,), generator=g)], dtype=object)
    lengths = torch.randint(1, T + 1, (bs,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    scores = torch.randint(0, 3, (bs,), generator=g).float()
    return rewards_on_last_token(scores, mask), mask, index, scores, lengths.float()


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("uids", ["str", "mixed"])
def test_vectorised_equals_loop(seed, uids):
    rewards, mask, index, scores, lengths = random_batch(seed)
    if uids == "mixed":  # "g3" -> 3 at odd rows, "3" at even ones: the loops' dicts keep them apart, as verl's does
        index = np.array([int(u[1]) if i % 2 else u[1] for i, u in enumerate(index)], dtype=object)
    for norm in (True, False):
        adv, _ = run("grpo", token_level_rewards=rewards, response_mask=mask, index=index,
                     norm_adv_by_std_in_grpo=norm)
        assert torch.allclose(adv[:, 0], loop_grpo(scores, index, norm), atol=1e-5)
    adv, _ = run("rloo", token_level_rewards=rewards, response_mask=mask, index=index)
    assert torch.allclose(adv[:, 0], loop_rloo(scores, index), atol=1e-5)
    adv, _ = run("opo", token_level_rewards=rewards, response_mask=mask, index=index)
    assert torch.allclose(adv[:, 0], loop_opo(scores, lengths, index), atol=1e-5)


GROUPED = ["grpo", "rloo", "opo", "reinforce_plus_plus_baseline"]


@pytest.mark.parametrize("name", GROUPED + ["grpo_passk"])
def test_invariant_to_sample_order(name):
    rewards, mask, index, *_ = random_batch(1)
    index = np.array([f"g{i // 4}" for i in range(24)], dtype=object)  # 6 groups of 4
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    adv, _ = run(name, token_level_rewards=rewards, response_mask=mask, index=index)
    adv_p, _ = run(name, token_level_rewards=rewards[perm], response_mask=mask[perm], index=index[perm.numpy()])
    if name == "grpo_passk":  # ties are broken by row order, so compare only where no tie decides
        assert torch.allclose(adv_p.sum(), adv.sum(), atol=1e-5)
    else:
        assert torch.allclose(adv_p, adv[perm], atol=1e-5)


@pytest.mark.parametrize("name", GROUPED + ["grpo_passk", "reinforce_plus_plus"])
def test_invariant_to_extra_padding(name):
    rewards, mask, index, *_ = random_batch(2)
    index = np.array([f"g{i // 4}" for i in range(24)], dtype=object)
    pad = torch.zeros(24, 3)
    adv, ret = run(name, token_level_rewards=rewards, response_mask=mask, index=index)
    adv_p, ret_p = run(name, token_level_rewards=torch.cat([rewards, pad], 1), response_mask=torch.cat([mask, pad], 1),
                       index=index)
    assert torch.allclose(adv_p[:, :7], adv, atol=1e-5) and adv_p[:, 7:].abs().max() == 0


# ------------------------------------------------------------------ registry and DataProto entry point
def test_unknown_estimator_lists_registered():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'grpoo'; registered: \[.*'grpo'.*'rloo'"):
        get_adv_estimator_fn("grpoo")


def test_registering_another_function_under_a_taken_name_raises():
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_adv_est("grpo")(lambda **kw: None)


def test_registering_the_same_function_again_is_allowed_as_in_verl():
    fn = get_adv_estimator_fn("grpo")
    assert register_adv_est("grpo")(fn) is fn
    assert get_adv_estimator_fn("grpo") is fn


def test_enum_names_register_their_value():
    import enum

    class Estimator(str, enum.Enum):
        MINE = "test_enum_estimator"

    def mine(token_level_rewards, response_mask, index, config=None, **unused):
        return token_level_rewards, token_level_rewards

    try:
        register_adv_est(Estimator.MINE)(mine)
        assert "test_enum_estimator" in ADV_ESTIMATORS.names()  # the value, not the Enum member
        assert all(isinstance(name, str) for name in ADV_ESTIMATORS.names())
        assert get_adv_estimator_fn("test_enum_estimator") is mine
        assert get_adv_estimator_fn(Estimator.MINE) is mine
    finally:
        ADV_ESTIMATORS._entries.pop("test_enum_estimator", None)


def test_registered_set():
    assert set(ADV_ESTIMATORS.names()) >= {"grpo", "grpo_passk", "rloo", "opo", "reinforce_plus_plus",
                                           "reinforce_plus_plus_baseline", "remax", "gae"}


def test_compute_advantage_on_dataproto():
    data = DataProto.from_dict({"token_level_rewards": rewards_on_last_token(), "response_mask": MASK},
                               {"uid": INDEX})
    compute_advantage(data, AlgorithmConfig(adv_estimator="rloo"))
    assert torch.allclose(per_sample(data.batch["advantages"]), torch.tensor([1.0, -1.0, -3.0, 0.0, 3.0]))
    with pytest.raises(ValueError, match="needs key"):
        compute_advantage(DataProto.from_dict({"response_mask": MASK}), AlgorithmConfig(adv_estimator="grpo"))


def test_an_episode_in_several_samples_counts_once_in_its_group():
    """Group "a": episode a1 (score 1) is two samples (an agent that rewrote its context), a2
    (score 0) one; group "b": b1 (score 2) and b2 (score 4), one sample each. GRPO over episodes:
    a: mean 0.5, std (unbiased) sqrt(0.5) = 0.7071 -> a1 +0.7071 on both its samples, a2 -0.7071;
    b: mean 3, std sqrt(2) = 1.4142 -> b1 -0.7071, b2 +0.7071. Over rows, group a would be
    [1, 1, 0]: mean 0.667, std 0.577 -> +0.577, +0.577, -1.155."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    # a1's first sample scored 0 by its own text: the episode's score is its last sample's
    scores = torch.tensor([0.0, 1.0, 0.0, 2.0, 4.0])
    data = DataProto.from_dict({"token_level_rewards": rewards_on_last_token(scores, mask), "response_mask": mask},
                               {"uid": np.array(["a", "a", "a", "b", "b"], dtype=object),
                                "episode_sample": np.array([0, 1, 0, 0, 0])})
    compute_advantage(data, AlgorithmConfig(adv_estimator="grpo"))
    r = 1 / math.sqrt(2)
    expected = torch.tensor([r, r, -r, -r, r])[:, None] * mask
    assert torch.allclose(data.batch["advantages"], expected, atol=1e-5)


def test_split_episodes_refuse_an_estimator_whose_advantage_varies_along_the_response():
    mask = torch.ones(4, 3)
    data = DataProto.from_dict({"token_level_rewards": rewards_on_last_token(torch.tensor([1.0, 0, 1, 0]), mask),
                                "response_mask": mask, "values": torch.rand(4, 3)},
                               {"uid": np.array(["a", "a", "a", "b"], dtype=object),
                                "episode_sample": np.array([0, 1, 0, 0])})
    with pytest.raises(ValueError, match="adv_estimator='gae' gives advantages that vary along a response"):
        compute_advantage(data, AlgorithmConfig(adv_estimator="gae"))


# ------------------------------------------------------------------ verl's gpg, rloo_vectorized, grpo_vectorized
# Groups "a" = [1, 0], "b" = [0, 0], "c" = [2] (a group of one); 2 of the 5 scores are non-zero.
V_INDEX = np.array(["a", "a", "b", "b", "c"], dtype=object)
V_SCORES = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0])


def run_v(name, scores=V_SCORES, index=V_INDEX, **kw):
    mask = torch.ones(len(scores), 2)
    adv, ret = run(name, token_level_rewards=torch.stack([torch.zeros_like(scores), scores], 1), response_mask=mask,
                   index=index, **kw)
    assert torch.equal(adv, ret)
    return per_sample(adv, mask)


def test_gpg_scales_the_group_centred_score_by_batch_over_nonzero_scores():
    # verl: alpha = bsz / count_nonzero(scores) = 5 / 2 = 2.5; adv = alpha * (score - group mean) / f_norm (1)
    # a: mean 0.5 -> 2.5 * 0.5 = 1.25, -1.25; b: 0, 0; c: a group of one, mean 0 -> 2.5 * 2 = 5
    assert torch.allclose(run_v("gpg"), torch.tensor([1.25, -1.25, 0.0, 0.0, 5.0]))
    # every score 0: alpha = 5 / max(0, 1) = 5, every advantage 0
    assert torch.allclose(run_v("gpg", scores=torch.zeros(5)), torch.zeros(5))


def test_rloo_vectorized_gives_a_group_of_one_zero():
    # verl: (n * s - group sum) / max(n - 1, 1) * (n > 1): a: (2*1 - 1)/1 = 1, (0 - 1)/1 = -1; b: 0, 0;
    # c: n = 1 -> 0 (where rloo keeps the score 2)
    assert torch.allclose(run_v("rloo_vectorized"), torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0]))


def test_grpo_vectorized_floors_the_group_variance_at_epsilon():
    # verl's group_mean_std: std = sqrt(max(unbiased var, eps)), eps = 1e-6; adv = (s - mean) / (std + eps)
    # group [0, 0.001]: mean 0.0005, var = 2 * 0.0005^2 / 1 = 5e-7 < 1e-6 -> std = 1e-3;
    # adv = -+0.0005 / (1e-3 + 1e-6) = -+0.4995005 (grpo: std sqrt(5e-7) = 7.0711e-4 -> -+0.70700)
    # group [1, 3]: mean 2, var 2, std 1.41421 -> -+1 / 1.414215 = -+0.707106; "c" a group of one: 2 / (1 + 1e-6)
    scores = torch.tensor([0.0, 0.001, 1.0, 3.0, 2.0])
    expected = torch.tensor([-0.4995005, 0.4995005, -0.7071063, 0.7071063, 2.0 / (1 + 1e-6)])
    assert torch.allclose(run_v("grpo_vectorized", scores=scores), expected, atol=1e-6)
    # all equal: var 0 -> std 1e-3, the advantages 0
    assert torch.allclose(run_v("grpo_vectorized", scores=torch.ones(5)), torch.tensor([0.0, 0, 0, 0, 1 / (1 + 1e-6)]))
    # without the std (Dr.GRPO): score - group mean
    no_std = run_v("grpo_vectorized", scores=scores, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(no_std, torch.tensor([-0.0005, 0.0005, -1.0, 1.0, 2.0]), atol=1e-7)


def test_verls_other_registered_estimators_are_here():
    assert set(ADV_ESTIMATORS.names()) >= {"gpg", "rloo_vectorized", "grpo_vectorized"}
