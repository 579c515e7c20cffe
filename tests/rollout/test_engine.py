"""The native rollout engine: exact greedy, reproducible sampling, correct distributions,
log-probs, stop conditions and the shared prompt cache."""

import math

import numpy as np
import pytest
import torch

from rlvr.config.schema import RolloutConfig
from rlvr.data import left_pad
from rlvr.models import load_model, load_tokenizer
from rlvr.protocol import DataProto
from rlvr.rollout import NativeRollout, SamplingParams, filter_probs, sample_tokens
from rlvr.rollout.engine import common_prefix_length
from rlvr.rollout.sampling import inverse_cdf

QUESTIONS = ["Hi", "What is 12 + 7? Answer with a number.", "Tell me a very long story about a dragon and a knight.",
             "2 * 3 = ?"]


def prompt_ids(tokenizer, questions=QUESTIONS):
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                           tokenize=False), add_special_tokens=False)
            for q in questions]


def batch_of(tokenizer, ids, n=1, uids=True):
    input_ids, mask, pos = left_pad(ids, tokenizer.pad_token_id)
    non_tensors = {"uid": [f"u{i}" for i in range(len(ids))]} if uids else {}
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": pos},
                               non_tensors).repeat(n, interleave=True)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


def reference_greedy(model, tokenizer, ids, max_new_tokens, eos_ids):
    input_ids, mask, _ = left_pad(ids, tokenizer.pad_token_id)
    out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                         eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)[:, input_ids.shape[1]:]
    rows = []
    for row in out.tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        rows.append(row[:cut])
    return rows


def test_greedy_equals_generate_on_tiny_model(tiny):
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=24)
    ids = prompt_ids(tokenizer)
    got = engine.generate(ids, SamplingParams(max_new_tokens=24, do_sample=False))
    assert [c.token_ids for c in got] == reference_greedy(model, tokenizer, ids, 24, engine.eos_ids)


def test_greedy_with_lora_on_the_embedding_and_head_equals_the_peft_models(tiny):
    """Adapters on embed_tokens and lm_head: the lean decode step read the base embedding's and
    head's weights (``.weight`` of a peft layer is its base layer's), so every token after the
    first was decoded without them."""
    import copy

    from rlvr.models.lora import apply_lora, unwrap

    model, tokenizer = tiny
    lora = apply_lora(copy.deepcopy(model), 4, 8, ["embed_tokens", "lm_head"])
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_embedding_A" in name or "lora_B" in name:  # the halves peft starts at 0
                p.normal_(0, 0.5)
    ids = prompt_ids(tokenizer)
    engine = NativeRollout(unwrap(lora), tokenizer, RolloutConfig(), max_response_length=16)
    assert engine.lean is not None  # the lean step runs, with the adapters' terms
    expected = reference_greedy(lora, tokenizer, ids, 16, engine.eos_ids)
    assert expected != reference_greedy(model, tokenizer, ids, 16, engine.eos_ids)
    got = engine.generate(ids, SamplingParams(max_new_tokens=16, do_sample=False))
    assert [c.token_ids for c in got] == expected


@pytest.mark.slow
def test_greedy_equals_generate_on_builtin_model():
    model, tokenizer = load_model("builtin"), load_tokenizer("builtin")
    engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=32)
    ids = prompt_ids(tokenizer)
    got = engine.generate(ids, SamplingParams(max_new_tokens=32, do_sample=False))
    assert [c.token_ids for c in got] == reference_greedy(model, tokenizer, ids, 32, engine.eos_ids)
    assert any(c.finish_reason == "stop" for c in got)  # the short questions end with <|im_end|>


def test_seeded_sampling_is_reproducible(tiny):
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(temperature=1.0), max_response_length=10)
    ids = prompt_ids(tokenizer) * 2
    a = engine.generate(ids, SamplingParams(max_new_tokens=10, seed=7))
    b = engine.generate(ids, SamplingParams(max_new_tokens=10, seed=7))
    c = engine.generate(ids, SamplingParams(max_new_tokens=10, seed=8))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


def test_shared_prompt_cache_gives_the_same_tokens(tiny):
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=12)
    ids = [p for p in prompt_ids(tokenizer) for _ in range(4)]  # each prompt 4 times, interleaved
    params = SamplingParams(max_new_tokens=12, seed=3)
    shared = engine.generate(ids, params)  # same tokens -> one prefill per prompt
    unshared = engine.generate(ids, params, groups=list(range(len(ids))))  # every row prefilled alone
    assert [c.token_ids for c in shared] == [c.token_ids for c in unshared]
    assert np.allclose(np.concatenate([c.log_probs for c in shared]),
                       np.concatenate([c.log_probs for c in unshared]), atol=1e-5)


def test_rollout_log_probs_match_a_full_forward(tiny):
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(temperature=0.7), max_response_length=16)
    batch = batch_of(tokenizer, prompt_ids(tokenizer), n=2)
    batch.meta_info["seed"] = 1
    out = engine.generate_sequences(batch)
    P = batch.batch["input_ids"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                       position_ids=out.batch["position_ids"]).logits[:, P - 1:-1].float() / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, out.batch["responses"][..., None]).squeeze(-1)
    mask = out.batch["response_mask"].bool()
    assert (out.batch["rollout_log_probs"][mask] - ref[mask]).abs().max() < 1e-4


def test_generate_sequences_layout(tiny):
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=8)
    batch = batch_of(tokenizer, prompt_ids(tokenizer), n=3)
    out = engine.generate_sequences(batch)
    B, P = batch.batch["input_ids"].shape
    R = out.batch["responses"].shape[1]
    assert R <= 8 and out.batch["input_ids"].shape == (B, P + R)
    assert torch.equal(out.batch["prompts"], batch.batch["input_ids"])
    assert torch.equal(out.batch["attention_mask"][:, P:], out.batch["response_mask"])
    assert torch.equal(out.batch["position_ids"][:, P], batch.batch["position_ids"][:, -1] + 1)
    lengths = out.batch["response_mask"].sum(1)
    for r in range(B):  # right-padded: ones then zeros, pad ids after the end
        n = int(lengths[r])
        assert out.batch["response_mask"][r, :n].all() and not out.batch["response_mask"][r, n:].any()
        assert (out.batch["responses"][r, n:] == tokenizer.pad_token_id).all()
        assert (out.batch["rollout_log_probs"][r, n:] == 0).all()
    assert set(out.non_tensor_batch["finish_reason"]) <= {"stop", "length"}
    merged = batch.union(out.select(batch_keys=["responses", "response_mask"], non_tensor_batch_keys=[]))
    assert len(merged) == B


def test_eos_and_length_stop(tiny):
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=6)
    ids = prompt_ids(tokenizer)[:2]
    for c in engine.generate(ids, SamplingParams(max_new_tokens=6, do_sample=False)):
        assert len(c.token_ids) <= 6 and len(c.log_probs) == len(c.token_ids)
        if c.finish_reason == "length":
            assert len(c.token_ids) == 6 and c.token_ids[-1] not in engine.eos_ids
    # an engine whose end tokens are the whole vocabulary stops every row after one token
    engine.eos_ids = list(range(len(tokenizer)))
    got = engine.generate(ids, SamplingParams(max_new_tokens=6, do_sample=False))
    assert all(len(c.token_ids) == 1 and c.finish_reason == "stop" for c in got)


def test_stop_strings(tiny):
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=20)
    ids = prompt_ids(tokenizer)[:1]
    free = engine.generate(ids, SamplingParams(max_new_tokens=20, do_sample=False))[0]
    text = tokenizer.decode(free.token_ids)
    stop = tokenizer.decode(free.token_ids[5:7])  # a string the greedy continuation produces
    assert stop and stop in text
    stopped = engine.generate(ids, SamplingParams(max_new_tokens=20, do_sample=False, stop=(stop,)))[0]
    assert stopped.finish_reason == "stop" and stop in tokenizer.decode(stopped.token_ids)
    assert len(stopped.token_ids) <= 7 and stopped.token_ids == free.token_ids[:len(stopped.token_ids)]


def test_meta_info_overrides_config(tiny):
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(do_sample=True, temperature=1.0), max_response_length=10)
    batch = batch_of(tokenizer, prompt_ids(tokenizer))
    batch.meta_info.update(do_sample=False, max_new_tokens=4)
    out = engine.generate_sequences(batch)
    assert out.batch["responses"].shape[1] <= 4
    greedy = engine.generate(prompt_ids(tokenizer), SamplingParams(max_new_tokens=4, do_sample=False))
    for r, c in enumerate(greedy):
        assert out.batch["responses"][r, :len(c.token_ids)].tolist() == c.token_ids


def test_request_level_continuation(tiny):
    """A multi-turn loop continues from token ids: prompt + completion + tool text, no re-tokenising."""
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=8)
    first = prompt_ids(tokenizer)[1]
    turn1 = engine.generate([first], SamplingParams(max_new_tokens=5, do_sample=False))[0]
    tool = tokenizer.encode("<|im_start|>user\nresult: 19<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    context = first + turn1.token_ids + tool
    turn2 = engine.generate([context], SamplingParams(max_new_tokens=5, do_sample=False))[0]
    expected = reference_greedy(model, tokenizer, [context], 5, engine.eos_ids)[0]
    assert turn2.token_ids == expected


def test_turns_continue_from_the_kept_cache(tiny, monkeypatch):
    """Inside turn_cache(), a prompt that continues a stopped completion (its tokens, then a tool's)
    prefills only the new tokens; the turn it samples equals a full prefill's: the same tokens,
    log-probs within float rounding. Rows of one call keep turns of other lengths (holes in the
    key mask), a fresh prompt runs beside them, a context that continues no kept turn reuses
    nothing, and nothing is kept outside. (The prompts' common opening, prefilled once in any
    batch, is turned off here to count the turns' reuse alone.)"""
    monkeypatch.setattr("rlvr.rollout.core.SHARED_PREFIX_MIN_TOKENS", 10 ** 9)
    model, tokenizer = tiny
    engine, reference = (NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=12) for _ in range(2))
    ids = prompt_ids(tokenizer)
    first = SamplingParams(max_new_tokens=12, seed=0, stop=("e", "a"))  # common letters: rows stop early, at other lengths
    then = SamplingParams(max_new_tokens=10, seed=1)
    tools = [tokenizer.encode(f"<|im_start|>tool\nresult: {'7' * (1 + 3 * i)}<|im_end|>\n<|im_start|>assistant\n",
                              add_special_tokens=False) for i in range(8)]
    with engine.turn_cache():
        turn1 = engine.generate([p for p in ids for _ in range(2)], first, groups=[i for i in range(4) for _ in range(2)])
        stopped = [r for r, c in enumerate(turn1) if c.finish_reason == "stop"]
        assert len(stopped) >= 6 and len({len(turn1[r].token_ids) for r in stopped}) > 1
        contexts = [ids[r // 2] + c.token_ids + tools[r] for r, c in enumerate(turn1)]
        # a context that leaves its conversation inside the prompt: no kept turn is a prefix of it
        contexts[7] = ids[3][:-3] + tokenizer.encode(" scripted", add_special_tokens=False) + tools[7]
        before = dict(engine.prefill_tokens)
        turn2 = engine.generate(contexts + [ids[0]], then)
        reused = engine.prefill_tokens["reused"] - before["reused"]
        assert reused == sum(len(ids[r // 2]) + len(turn1[r].token_ids) - 1 for r in stopped if r != 7)
        assert engine.prefill_tokens["computed"] - before["computed"] == sum(map(len, contexts + [ids[0]])) - reused
    assert not engine._turns and engine.core.keeping is None and not engine.core.kept
    full = reference.generate(contexts + [ids[0]], then)
    assert reference.prefill_tokens["reused"] == 0
    for got, want in zip(turn2, full):
        assert got.token_ids == want.token_ids
        torch.testing.assert_close(torch.tensor(got.log_probs), torch.tensor(want.log_probs), atol=1e-5, rtol=0)


def test_a_common_opening_is_prefilled_once_and_samples_as_a_full_prefill(tiny, monkeypatch):
    """The chat template's system prompt opens every prompt: it is prefilled once for the wave,
    and the rows sample what prompts prefilled whole sample (tokens equal, log-probs within
    float rounding), greedy and at T = 1 with groups."""
    import rlvr.rollout.core as engine_module

    model, tokenizer = tiny
    ids = prompt_ids(tokenizer)
    opening = engine_module.common_prefix_length(ids)
    assert opening >= engine_module.SHARED_PREFIX_MIN_TOKENS  # the template's system prompt
    runs = {}
    for share in (True, False):
        if not share:
            monkeypatch.setattr(engine_module, "SHARED_PREFIX_MIN_TOKENS", 10 ** 9)
        engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=16)
        greedy = engine.generate(ids, SamplingParams(max_new_tokens=16, do_sample=False))
        sampled = engine.generate([p for p in ids for _ in range(3)], SamplingParams(max_new_tokens=16, seed=5),
                                  groups=[i for i in range(4) for _ in range(3)])
        runs[share] = (greedy + sampled, dict(engine.prefill_tokens))
    (shared, counts), (full, full_counts) = runs[True], runs[False]
    assert counts["computed"] == full_counts["computed"] - 2 * 3 * opening  # 4 prompts, 3 of 4 openings saved, twice
    assert full_counts["reused"] == 0
    for got, want in zip(shared, full):
        assert got.token_ids == want.token_ids
        torch.testing.assert_close(torch.tensor(got.log_probs), torch.tensor(want.log_probs), atol=1e-5, rtol=0)


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5], [6]]) == 0
    assert common_prefix_length([[1, 2], [1, 2]]) == 2


def test_a_kept_turn_lasts_one_call(tiny, monkeypatch):
    """A conversation continues in the very next call or not at all: the call after drops the
    turns it did not use, so a rollout never holds more than one turn's stopped rows."""
    monkeypatch.setattr("rlvr.rollout.core.SHARED_PREFIX_MIN_TOKENS", 10 ** 9)
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=8)
    ids = prompt_ids(tokenizer)[:1]
    params = SamplingParams(max_new_tokens=8, seed=0, stop=("e", "a"))
    with engine.turn_cache():
        turn1 = engine.generate(ids, params)
        assert turn1[0].finish_reason == "stop" and len(engine.core.keeping) == 1
        engine.generate(prompt_ids(tokenizer)[1:2], params)  # another conversation: turn 1's is dropped
        assert all(k.ids[:len(ids[0])] != tuple(ids[0]) for k in engine.core.keeping)
        engine.generate([ids[0] + turn1[0].token_ids], params)
    assert engine.prefill_tokens["reused"] == 0


# ------------------------------------------------------------------ the sampler itself
def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def draw(logits, params, n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    uniforms = 1.0 - torch.rand(n, generator=g)
    tokens, _ = sample_tokens(logits.expand(n, -1), params, uniforms)
    return torch.bincount(tokens, minlength=logits.shape[-1]).float()


LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0]])


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_first_token_distribution_is_softmax_over_temperature(temperature):
    counts = draw(LOGITS, SamplingParams(max_new_tokens=1, temperature=temperature))
    probs = torch.softmax(LOGITS[0] / temperature, -1)
    # 7 degrees of freedom: the 99.9% quantile of chi-square(7) is 24.3
    assert chi_square(counts, probs) < 24.3


def test_top_k_and_top_p_are_respected():
    counts = draw(LOGITS, SamplingParams(max_new_tokens=1, top_k=3))
    probs = torch.softmax(LOGITS[0], -1)
    top3 = torch.zeros(8)
    top3[:3] = probs[:3] / probs[:3].sum()
    assert counts[3:].sum() == 0 and chi_square(counts, top3) < 13.8  # chi-square(2) 99.9%
    # top-p 0.8: softmax = (.531, .195, .118, .072, ...): mass before each token .0, .531, .726, .844
    # -> the first 3 tokens reach 0.8; the 4th starts after 0.8 and is dropped
    counts = draw(LOGITS, SamplingParams(max_new_tokens=1, top_p=0.8))
    kept = (probs.cumsum(0) - probs) <= 0.8
    assert kept.tolist() == [True] * 3 + [False] * 5 and counts[~kept].sum() == 0
    assert chi_square(counts, torch.where(kept, probs, 0) / probs[kept].sum()) < 13.8  # chi-square(2) 99.9%


def test_top_p_at_an_exact_tie_keeps_what_transformers_and_vllm_keep():
    """Probabilities 1/2, 1/4, 1/8, 1/8 (exact in binary) at top_p 0.75: the mass before the third
    token is exactly 0.75, so the first two already reach top_p and the rest go (transformers'
    warper drops tokens whose cumulative mass from the tail is <= 1 - top_p = 0.25: the two 1/8s).
    A rule that waits for the mass before a token to pass top_p keeps three."""
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()
    ours = filter_probs(logits.softmax(-1), SamplingParams(max_new_tokens=1, top_p=0.75))[0] > 0
    theirs = TopPLogitsWarper(top_p=0.75)(None, logits.clone())[0] > float("-inf")
    assert ours.tolist() == theirs.tolist() == [True, True, False, False]


def test_min_p_and_filter_keeps_at_least_one():
    probs = torch.softmax(LOGITS, -1)
    filtered = filter_probs(probs, SamplingParams(max_new_tokens=1, min_p=0.3))
    # min_p 0.3 of the top prob 0.5 -> keep probs >= 0.15: tokens 0 and 1
    assert (filtered[0] > 0).tolist() == [True, True] + [False] * 6
    assert (filter_probs(probs, SamplingParams(max_new_tokens=1, top_p=1e-9))[0] > 0).sum() == 1


@pytest.mark.parametrize("kwargs", [dict(top_k=2), dict(top_p=0.6), dict(min_p=0.3)])
def test_truncated_sampling_reports_the_distribution_it_drew_from(kwargs):
    """Each truncation keeps tokens 0 and 1 of LOGITS (softmax 0.531, 0.195, 0.119, ...; top-p 0.6: token
    0's 0.531 falls short, so token 1 is kept too; min-p 0.3 of 0.531 keeps >= 0.159): the log-prob
    reported is the token's probability renormalised over the two, e^2 / (e^2 + e) = 0.731 or
    e / (e^2 + e) = 0.269, not its share of the whole vocabulary."""
    tokens, lp = sample_tokens(LOGITS.expand(64, -1), SamplingParams(max_new_tokens=1, **kwargs),
                               torch.rand(64, generator=torch.Generator().manual_seed(0)))
    kept = {0: math.e ** 2 / (math.e ** 2 + math.e), 1: math.e / (math.e ** 2 + math.e)}
    assert set(tokens.tolist()) == {0, 1}
    for token, value in zip(tokens.tolist(), lp.tolist()):
        assert value == pytest.approx(math.log(kept[token]), abs=1e-6)
    _, full = sample_tokens(LOGITS.expand(64, -1), SamplingParams(max_new_tokens=1),
                            torch.rand(64, generator=torch.Generator().manual_seed(0)))
    assert full.max().item() == pytest.approx(math.log(torch.softmax(LOGITS[0], -1)[0].item()))  # untruncated


def test_greedy_log_prob_is_of_the_untempered_distribution():
    tokens, lp = sample_tokens(LOGITS, SamplingParams(max_new_tokens=1, do_sample=False, temperature=0.3), None)
    assert tokens.item() == 0 and lp.item() == pytest.approx(math.log(torch.softmax(LOGITS[0], -1)[0].item()))


# ------------------------------------------------------------------ exactness on a real-size vocabulary
V_REAL = 49_152  # SmolLM2's vocabulary
# probabilities fall geometrically by e^-20 from the first token to the last (4e-4 down to 8e-13): in
# a float32 cumulative sum the last few thousand tokens sit where the sum is ~1 and its spacing is
# 6e-8, so they would get empty intervals (never drawn) and their neighbours their mass
REAL_LOGITS = -torch.arange(V_REAL, dtype=torch.float32) * (20.0 / V_REAL)


def _reported_probs():
    """The sampler's own probabilities (float32 softmax, what its log-probs report), and in float64."""
    probs = torch.log_softmax(REAL_LOGITS[None], dim=-1).exp()  # (1, V)
    return probs, probs[0].double()


def test_every_token_above_1e_13_is_drawable_on_a_real_vocabulary():
    """The uniform at the middle of each token's interval must draw that token: checked for
    every token of the vocabulary with probability above 1e-13."""
    probs, exact = _reported_probs()
    cdf = exact.cumsum(0)
    tokens = torch.arange(V_REAL)[exact > 1e-13]
    assert exact[tokens].min() < 1e-12 and len(tokens) == V_REAL  # the check reaches the far tail
    middle = (cdf[tokens] - exact[tokens] / 2) / cdf[-1]  # (k,) a uniform inside each token's interval
    drawn = torch.cat([inverse_cdf(probs, chunk[None])[0] for chunk in middle.split(16_384)])
    wrong = (drawn != tokens).nonzero().flatten()
    assert len(wrong) == 0, f"{len(wrong)} tokens not drawable, e.g. {tokens[wrong[:5]].tolist()}"


def test_zero_probability_tokens_are_never_drawn_even_at_block_edges():
    """Filtered tokens (probability 0) at the ends of 256-token blocks and in the padding past the
    vocabulary, and uniforms at exact interval boundaries, 1.0 included."""
    probs = torch.zeros(1, 1000)
    probs[0, [3, 255, 256, 700, 999]] = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])
    cdf = probs[0].double().cumsum(0)
    edges = torch.cat([cdf[[3, 255, 256, 700, 999]] / cdf[-1], torch.tensor([1e-300, 0.5, 1.0], dtype=torch.float64)])
    drawn = inverse_cdf(probs, edges[None])[0]
    assert set(drawn.tolist()) <= {3, 255, 256, 700, 999}
    u = 1.0 - torch.rand(1, 20_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    counts = torch.bincount(inverse_cdf(probs, u)[0], minlength=1000).double()
    assert counts.nonzero().flatten().tolist() == [3, 255, 256, 700, 999]
    assert torch.allclose(counts[[3, 255, 256, 700, 999]] / 20_000, probs[0, [3, 255, 256, 700, 999]].double(), atol=0.015)


def test_empirical_frequencies_match_on_a_real_vocabulary():
    """400k draws binned into 32 blocks of equal probability mass: chi-square(31) below its 99.9%
    quantile (61.1), and the far tail (the last 8192 tokens, mass 1.5e-3) drawn as often as it should;
    then the whole sampler (softmax, filter, draw) on a few real-size rows agrees with the search."""
    probs, exact = _reported_probs()
    n = 400_000
    u = 1.0 - torch.rand(1, n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    counts = sum(torch.bincount(inverse_cdf(probs, chunk)[0], minlength=V_REAL).double() for chunk in u.split(50_000, 1))
    edges = torch.searchsorted(exact.cumsum(0), torch.linspace(0, 1, 33, dtype=torch.float64)[1:-1])
    bins = torch.bucketize(torch.arange(V_REAL), edges, right=True)
    observed = torch.zeros(32, dtype=torch.float64).index_add_(0, bins, counts)
    expected = torch.zeros(32, dtype=torch.float64).index_add_(0, bins, exact) * n
    assert float(((observed - expected) ** 2 / expected).sum()) < 61.1
    tail_expected = float(exact[-8192:].sum()) * n  # ~600
    assert abs(float(counts[-8192:].sum()) - tail_expected) < 4 * tail_expected ** 0.5
    rows = u[0, :8]
    tokens, lp = sample_tokens(REAL_LOGITS.expand(8, -1), SamplingParams(max_new_tokens=1), rows)
    assert torch.equal(tokens, inverse_cdf(probs, rows[None])[0])
    assert torch.allclose(lp, probs[0, tokens].log())


@pytest.mark.parametrize("max_num_seqs", [6, 3])
def test_at_most_max_num_seqs_rows_decode_and_rows_sample_as_in_one_batch(tiny, max_num_seqs, monkeypatch):
    """Four prompts x n = 4 sampled at T = 1 (rows stop at different lengths), at most 6 rows
    running (one group, then the next group joins as soon as 4 rows are free, beside the first
    group's last rows: continuous batching) or 3 (a group cut 3 + 1): every row's tokens and log-probs equal one batch's, no
    decode step holds more rows than allowed, and each admitted piece of a group is prefilled once."""
    model, tokenizer = tiny
    ids = [p for p in prompt_ids(tokenizer) for _ in range(4)]
    groups = [i // 4 for i in range(16)]
    params = SamplingParams(max_new_tokens=24, seed=7, stop=("r",))  # the tiny model never samples EOS
    one = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=24).generate(ids, params, groups)
    engine = NativeRollout(model, tokenizer, RolloutConfig(max_num_seqs=max_num_seqs), max_response_length=24)
    core = engine.core
    prefills, step_rows = [], []  # distinct prompts per prefill; rows sampled per step
    prefill, sample = core._prefill, core._sample
    monkeypatch.setattr(core, "_prefill", lambda unique, *rest: prefills.append(len(unique)) or prefill(unique, *rest))
    monkeypatch.setattr(core, "_sample", lambda: step_rows.append(len(core.running)) or sample())
    waves = engine.generate(ids, params, groups)
    assert [c.token_ids for c in waves] == [c.token_ids for c in one]
    # log-probs to float32 rounding: a matmul's kernel (and its sums' order) follows the batch size
    assert np.allclose(sum((c.log_probs for c in waves), []), sum((c.log_probs for c in one), []), atol=1e-5, rtol=0)
    assert len({len(c.token_ids) for c in one}) > 1  # rows of different lengths, so the test means something
    assert max(step_rows) == max_num_seqs  # full, never over
    # 6: a group joins while the last rows of the one before still run (4 + 2 rows);
    # each group's prompt prefilled once. 3: each group cut 3 + 1, prefilled twice
    assert prefills == [1] * (4 if max_num_seqs == 6 else 8)


def test_waves_keep_a_multi_turn_rows_own_uniforms(tiny):
    """Rows named by row_ids (a multi-turn turn over the requests still running) sample the
    same in waves as in one wave."""
    model, tokenizer = tiny
    ids = prompt_ids(tokenizer)
    params = SamplingParams(max_new_tokens=16, seed=3, row_ids=(5, 1, 7, 2), total_rows=8)
    one = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=16).generate(ids, params)
    waves = NativeRollout(model, tokenizer, RolloutConfig(max_num_seqs=1), max_response_length=16).generate(ids, params)
    assert [c.token_ids for c in waves] == [c.token_ids for c in one]


def test_decoding_on_cuda_leaves_out_cudnn_attention():
    """cuDNN's SDPA builds a plan for every new key length (every decode step): 45% of a GPU
    rollout's time went there (bench/gpu.py --parts profile). The flags are global settings, so
    this runs without a GPU; on a CPU device nothing changes."""
    from rlvr.rollout.engine import decode_attention

    assert torch.backends.cuda.cudnn_sdp_enabled()
    with decode_attention(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    with decode_attention(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored
