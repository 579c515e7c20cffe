"""The family matrix: on every model family users train, rlvr's training forward computes what the
model's own ``forward`` computes, the native engine's greedy tokens are ``generate``'s, and two
training steps run on-policy. Tiny random models from ``tests/families.py``; sequences of 10-18
tokens, longer than the 4-token sliding windows, so windows are in play."""

import types

import numpy as np
import pytest
import torch

from rlvr.config.schema import ActorConfig, OptimConfig, RolloutConfig
from rlvr.models.loader import ModelLoadError, load_model
from rlvr.protocol import DataProto
from rlvr.rollout import NativeRollout, SamplingParams
from rlvr.workers import forward
from rlvr.workers.actor import Actor, build_optimizer
from rlvr.workers.critic import _response_values
from tests.families import FAMILIES, REFUSED, VOCAB, tiny_model

RUN = [name for name in FAMILIES if name not in REFUSED]
PROMPT_LENGTHS = (7, 10)  # two groups
RESPONSE_LENGTHS = (8, 3, 6, 2, 8, 5)  # n = 3 rows per group, R = 8
ADVANTAGES = (1.0, -0.5, -0.5, 0.7, 0.7, -1.4)
TOL = 1e-4


def family_batch(seed: int = 0) -> DataProto:
    """Two groups of three rows: left-padded prompts, right-padded responses, token ids in [3, VOCAB)."""
    g = torch.Generator().manual_seed(seed)
    n, R, P = 3, max(RESPONSE_LENGTHS), max(PROMPT_LENGTHS)
    prompts = [torch.randint(3, VOCAB, (length,), generator=g) for length in PROMPT_LENGTHS]
    ids, mask, pos = [], [], []
    for row, L in enumerate(RESPONSE_LENGTHS):
        prompt = prompts[row // n]
        pad = P - len(prompt)
        response = torch.randint(3, VOCAB, (R,), generator=g) * (torch.arange(R) < L)
        ids.append(torch.cat([torch.zeros(pad, dtype=torch.long), prompt, response]))
        mask.append(torch.cat([torch.zeros(pad), torch.ones(len(prompt)), (torch.arange(R) < L).float()]).long())
        pos.append((mask[-1].cumsum(0) - 1).clamp(min=0))
    ids, mask, pos = torch.stack(ids), torch.stack(mask), torch.stack(pos)
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, P:],
         "response_mask": mask[:, P:]},
        {"uid": np.array([f"g{row // n}" for row in range(len(RESPONSE_LENGTHS))], dtype=object)})


def own_log_probs(model, batch: DataProto) -> torch.Tensor:
    """(B, R) log-probs of each response token by the model's own forward, one unpadded row at a time:
    ``log_softmax(model(ids).logits)``."""
    ids, mask, responses = batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["responses"]
    P = ids.shape[1] - responses.shape[1]
    out = torch.zeros(responses.shape)
    with torch.no_grad():
        for row in range(len(ids)):
            real = ids[row][mask[row].bool()]
            L = int(mask[row, P:].sum())
            logits = model(real[None]).logits[0].float()  # (T, V)
            logp = torch.log_softmax(logits, -1)[len(real) - L - 1:len(real) - 1]  # outputs predicting the response
            out[row, :L] = logp.gather(-1, real[len(real) - L:, None]).squeeze(-1)
    return out


def training_log_probs(model, batch: DataProto, layout: str, monkeypatch) -> torch.Tensor:
    """rlvr's training forward in one layout: ``flat`` (groups back to back, SDPA per segment),
    ``padded`` (a row per group, 4-D mask) or ``plain`` (a row per sample)."""
    if layout == "padded":  # the layout a non-SDPA attention gets
        monkeypatch.setattr(forward, "PACK_FLAT", False)
    keys = {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
    with torch.no_grad():
        lp, _ = forward.forward_log_probs(model, keys, batch.non_tensor_batch["uid"], 1.0,
                                          share_prompt=layout != "plain")
    return lp


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: a second thread only adds synchronisation on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=RUN)
def family(request):
    """A family's name, its tiny model, the test batch and the model's own log-probs of it."""
    model, batch = tiny_model(request.param), family_batch()
    return request.param, model, batch, own_log_probs(model, batch)


@pytest.mark.parametrize("layout", ["flat", "padded", "plain"])
def test_training_log_probs_are_the_models_own(family, layout, monkeypatch):
    name, model, batch, want = family
    mask = batch.batch["response_mask"].bool()
    got = training_log_probs(model, batch, layout, monkeypatch)
    diff = float((got - want)[mask].abs().max())
    assert diff < TOL, f"{name} {layout}: max |log-prob difference| {diff:.3g}"


def test_critic_values_are_the_same_in_every_layout(family, monkeypatch):
    """The critic's values go through the same forward: the grouped layout's equal the per-row one's."""
    name, model, batch, _ = family
    keys = {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
    torch.manual_seed(1)
    model.score = torch.nn.Linear(model.config.hidden_size, 1)  # a value head on the same backbone
    uids = batch.non_tensor_batch["uid"]
    try:
        with torch.no_grad():
            grouped = _response_values(model, keys, uids, 0)
            plain = _response_values(model, keys, np.array([f"r{i}" for i in range(len(uids))], dtype=object), 0)
    finally:
        del model.score
    mask = batch.batch["response_mask"].bool()
    assert float((grouped - plain)[mask].abs().max()) < TOL, name


class _Tokenizer(types.SimpleNamespace):
    """What the engine reads of a tokenizer: pad and EOS ids, and decode (for stop strings)."""

    pad_token_id = 0
    eos_token_id = 1

    def decode(self, ids, **kw):
        return " ".join(map(str, ids))


def test_engine_greedy_equals_generate(family):
    """Three prompts of different lengths decode together (left padding, windows passed by step 3)."""
    name, model, _, _ = family
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (length,), generator=g).tolist() for length in (2, 5, 9)]
    engine = NativeRollout(model, _Tokenizer(), RolloutConfig(), max_response_length=8)
    got = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_new_tokens=8, do_sample=False))]
    want = []
    for p in prompts:  # one unpadded row at a time: the model's own greedy
        out = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=8, eos_token_id=1,
                             pad_token_id=0)[0, len(p):].tolist()
        want.append(out[:out.index(1) + 1] if 1 in out else out)
    assert got == want, name


def test_two_training_steps_on_policy(family):
    """Step 1 starts on-policy against the model's own log-probs: ratio 1 everywhere, so
    ppo_kl = 0, nothing clipped, and pg_loss = -token-mean(advantage)
    = -(8*1 - 3*.5 - 6*.5 + 2*.7 + 8*.7 - 5*1.4) / 32 = -3.5 / 32. Step 2 sees the moved weights."""
    name, _, _, want = family
    model = tiny_model(name)  # its own copy: the steps change the weights
    batch = family_batch()
    batch.batch["old_log_probs"] = want
    batch.batch["advantages"] = torch.tensor(ADVANTAGES)[:, None] * batch.batch["response_mask"]
    cfg = ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=6, use_kl_loss=False, entropy_coeff=0.0)
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.0), total_steps=2)
    actor = Actor(model, cfg, optimizer=opt, scheduler=sched, pad_id=0, max_response_length=8)
    before = [p.detach().clone() for p in model.parameters()]
    first = actor.update_policy(batch)
    assert abs(first["actor/ppo_kl"]) < TOL, f"{name}: the update's forward is not the model's own"
    assert first["actor/pg_clipfrac"] == 0.0
    assert first["actor/pg_loss"] == pytest.approx(-3.5 / 32, abs=TOL)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    second = actor.update_policy(batch)
    assert second["actor/ppo_kl"] != 0.0  # the policy moved at step 1


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_family_is_refused_at_load(name, tmp_path):
    config = FAMILIES[name]()
    import transformers as tf

    tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=REFUSED[name]):
        load_model(tmp_path)


def test_a_family_the_grouped_layout_cannot_express_runs_per_row_and_says_so_once(monkeypatch):
    """Qwen3.5's linear-attention layers carry state along a row: packed groups would leak into each
    other, so the forward runs one row per sample (its log-probs the model's own, above) and warns
    once, naming the family and the reason."""
    monkeypatch.setattr(forward, "_WARNED", set())
    model, batch = tiny_model("qwen3.5"), family_batch()
    with pytest.warns(UserWarning, match="Qwen3_5ForCausalLM: the training forward runs one row per sample.*"
                                         "linear_attention layers carry state"):
        training_log_probs(model, batch, "flat", monkeypatch)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        training_log_probs(model, batch, "flat", monkeypatch)
    assert forward.grouped_layout_problem(tiny_model("gemma2-window")) is None  # windows: the grouped layout


def test_window_mask_by_hand():
    """Prompt of 3 (positions 0-2), response 1 of 2 (positions 3-4), response 2 of 2 (positions 3-4 again),
    window 2: a token sees the keys at its own position and the one before, within its prompt-once mask."""
    segment = torch.tensor([[0, 0, 0, 1, 1, 2, 2]])
    positions = torch.tensor([[0, 1, 2, 3, 4, 3, 4]])
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0],  # prompt 0: itself
        [1, 1, 0, 0, 0, 0, 0],  # prompt 1: 0, 1
        [0, 1, 1, 0, 0, 0, 0],  # prompt 2: 1, 2 (0 is 2 positions away)
        [0, 0, 1, 1, 0, 0, 0],  # response 1 at 3: prompt 2 and itself
        [0, 0, 0, 1, 1, 0, 0],  # response 1 at 4: 3, 4 (prompt 2 is 2 away)
        [0, 0, 1, 0, 0, 1, 0],  # response 2 at 3: prompt 2 and itself, not response 1
        [0, 0, 0, 0, 0, 1, 1],  # response 2 at 4: its own 3 and 4
    ], dtype=torch.bool)
    assert torch.equal(forward.segment_mask(segment, positions, 2)[0, 0], expected)
