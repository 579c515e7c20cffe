"""The engine core: requests that arrive while others decode, each with its own parameters,
aborts, pauses and weight versions. The reference is transformers' ``generate`` run on each
request alone, so nothing here is computed by the code under test."""

import pytest
import torch

from rlvr.config.schema import RolloutConfig
from rlvr.rollout import NativeRollout, SamplingParams
from rlvr.rollout.core import EngineCore, Request
from tests.rollout.test_engine import prompt_ids, reference_greedy, tiny  # noqa: F401 (fixture)

GREEDY = SamplingParams(max_new_tokens=12, do_sample=False)


def core_of(model, tokenizer, max_num_seqs=8, lean=True):
    engine = NativeRollout(model, tokenizer, RolloutConfig(max_num_seqs=max_num_seqs, lean_decode=lean), 32)
    return engine.core, engine


def step_until_done(core, seqs, limit=500):
    for _ in range(limit):
        if all(s.finish_reason is not None for s in seqs):
            return [s.completion() for s in seqs]
        core.step()
    raise AssertionError("requests did not finish")


@pytest.mark.parametrize("lean", [True, False])
def test_requests_joining_a_running_batch_decode_as_alone(tiny, lean):
    """Requests arrive while others decode (after 0, 3 and 7 steps), with their own budgets, and
    with room for 2 rows a later request waits for a free row: a longer prompt joins shorter
    running rows (they move right), a short one joins long ones (holes on its left). Each greedy
    completion equals generate() on that request alone."""
    model, tokenizer = tiny
    core, engine = core_of(model, tokenizer, max_num_seqs=2, lean=lean)
    ids = prompt_ids(tokenizer)  # lengths differ: the dragon story is the longest
    plan = [("a", ids[0], 12), ("b", ids[2], 5), ("c", ids[1], 9), ("d", ids[3], 12)]  # id, prompt, budget

    def add(name, prompt, budget):
        return core.add(Request(name, prompt, SamplingParams(max_new_tokens=budget, do_sample=False)))

    seqs = [add(*plan[0])]
    for _ in range(3):
        core.step()
    seqs.append(add(*plan[1]))
    for _ in range(4):
        core.step()
    seqs += [add(*plan[2]), add(*plan[3])]
    rows_seen = []
    while any(s.finish_reason is None for s in seqs):
        core.step()
        rows_seen.append(len(core.running))
    assert max(rows_seen) == 2  # never more than max_num_seqs
    for seq, (_, prompt, budget) in zip(seqs, plan):
        want = reference_greedy(model, tokenizer, [prompt], budget, engine.eos_ids)[0]
        assert seq.tokens == want, seq.request.id
        assert seq.finish_reason == ("stop" if want[-1] in engine.eos_ids else "length")


def test_the_slab_compacts_and_grows_without_changing_a_token(tiny, monkeypatch):
    """With 2 columns reserved ahead, the slab runs out of columns every few steps: it drops the
    holes between rows admitted at different times and grows; the greedy tokens still equal
    generate()'s and the log-probs a lone request's."""
    monkeypatch.setattr("rlvr.rollout.core.COLUMNS_AHEAD_MAX", 2)
    model, tokenizer = tiny
    core, engine = core_of(model, tokenizer, max_num_seqs=4)
    ids = prompt_ids(tokenizer)
    seqs = []
    for i, prompt in enumerate(ids):
        seqs.append(core.add(Request(str(i), prompt, SamplingParams(max_new_tokens=16, do_sample=False))))
        for _ in range(2 + i):
            core.step()
    capacities = set()
    while any(s.finish_reason is None for s in seqs):
        core.step()
        capacities.add(core.slab.capacity)
    assert len(capacities) > 1  # it grew
    alone = [core_of(model, tokenizer)[0].run([Request("x", p, SamplingParams(max_new_tokens=16, do_sample=False))])[0]
             for p in ids]
    for seq, prompt, want in zip(seqs, ids, alone):
        assert seq.tokens == reference_greedy(model, tokenizer, [prompt], 16, engine.eos_ids)[0]
        torch.testing.assert_close(torch.tensor(seq.log_probs), torch.tensor(want.log_probs), atol=1e-5, rtol=0)


def test_each_request_samples_with_its_own_parameters_and_seed(tiny):
    """A greedy request, a T = 1 request and a top-k request share batches: the greedy one equals
    generate(); the sampled ones draw what they draw alone (their seed's stream, not the batch's):
    same tokens, log-probs within float rounding; a different seed gives other tokens."""
    model, tokenizer = tiny
    ids = prompt_ids(tokenizer)
    reqs = [Request("g", ids[0], GREEDY),
            Request("t", ids[1], SamplingParams(max_new_tokens=12, seed=11)),
            Request("k", ids[2], SamplingParams(max_new_tokens=12, seed=12, top_k=5, temperature=0.7))]
    core, engine = core_of(model, tokenizer)
    together = core.run(reqs)
    alone = [core_of(model, tokenizer)[0].run([r])[0] for r in reqs]
    assert together[0].token_ids == reference_greedy(model, tokenizer, [ids[0]], 12, engine.eos_ids)[0]
    for got, want in zip(together, alone):
        assert got.token_ids == want.token_ids
        torch.testing.assert_close(torch.tensor(got.log_probs), torch.tensor(want.log_probs), atol=1e-5, rtol=0)
    reseeded = core_of(model, tokenizer)[0].run([Request("t", ids[1], SamplingParams(max_new_tokens=12, seed=99))])[0]
    assert reseeded.token_ids != together[1].token_ids


def test_stop_token_ids_and_ignore_eos_per_request(tiny):
    """A request's own stop tokens end it at the first one it samples (finish 'stop', matched names
    the token); ignore_eos runs to the length even through an end token."""
    model, tokenizer = tiny
    core, engine = core_of(model, tokenizer)
    ids = prompt_ids(tokenizer)
    free = core.run([Request("free", ids[1], SamplingParams(max_new_tokens=12, do_sample=False))])[0]
    stop_at = free.token_ids[4]
    first = free.token_ids.index(stop_at)
    got = core.run([Request("s", ids[1], SamplingParams(max_new_tokens=12, do_sample=False), stop_token_ids=(stop_at,))])[0]
    assert got.token_ids == free.token_ids[:first + 1] and got.finish_reason == "stop" and got.matched == stop_at
    core.eos_ids = frozenset(free.token_ids[:1])  # the first token it samples is an end token now
    assert core.run([Request("e", ids[1], GREEDY)])[0].token_ids == free.token_ids[:1]
    ignoring = core.run([Request("i", ids[1], GREEDY, ignore_eos=True)])[0]
    assert ignoring.token_ids == free.token_ids and ignoring.finish_reason == "length"


def test_abort_frees_the_row_for_the_next_request(tiny):
    """With one row, aborting the running request ends it ('abort', the tokens so far) and the
    waiting one is admitted at the next step; aborting a waiting one never runs it."""
    model, tokenizer = tiny
    core, engine = core_of(model, tokenizer, max_num_seqs=1)
    ids = prompt_ids(tokenizer)
    a = core.add(Request("a", ids[2], SamplingParams(max_new_tokens=30, do_sample=False)))
    b = core.add(Request("b", ids[1], GREEDY))
    c = core.add(Request("c", ids[3], GREEDY))
    for _ in range(4):
        core.step()
    assert [s.request.id for s in core.running] == ["a"] and len(a.tokens) == 4
    assert core.abort("a") and core.abort("c")
    assert a.finish_reason == "abort" and len(a.tokens) == 4 and c.finish_reason == "abort" and c.tokens == []
    assert not core.running
    core.step()
    assert [s.request.id for s in core.running] == ["b"]
    step_until_done(core, [b])
    assert b.tokens == reference_greedy(model, tokenizer, [ids[1]], 12, engine.eos_ids)[0]
    assert not core.abort("b")  # finished: nothing to abort


@pytest.mark.parametrize("lean", [True, False])
def test_aborting_a_row_before_others_moves_them_and_they_decode_as_alone(tiny, lean):
    """Three rows run; the first is aborted between steps (where a server's abort runs, outside the
    step's inference mode). The last row moves into its slot, a write into the slab's inference
    tensors that raised before; the two left decode to generate()'s greedy tokens alone."""
    model, tokenizer = tiny
    core, engine = core_of(model, tokenizer, lean=lean)
    ids = prompt_ids(tokenizer)
    seqs = [core.add(Request(name, ids[i], GREEDY)) for i, name in enumerate("abc")]
    for _ in range(3):
        core.step()
    assert [s.request.id for s in core.running] == ["a", "b", "c"]
    assert core.abort("a")
    assert [s.request.id for s in core.running] == ["c", "b"]  # c filled a's slot
    step_until_done(core, seqs[1:])
    for seq, i in zip(seqs[1:], (1, 2)):
        assert seq.tokens == reference_greedy(model, tokenizer, [ids[i]], 12, engine.eos_ids)[0], seq.request.id


def test_pause_modes_and_weight_versions(tiny):
    """'wait' lets the running rows finish and admits nothing; 'abort' ends everything; 'in_place'
    keeps rows for after an update, and their completion says where the new version starts."""
    model, tokenizer = tiny
    ids = prompt_ids(tokenizer)
    core, _ = core_of(model, tokenizer, max_num_seqs=1)
    a = core.add(Request("a", ids[0], GREEDY))
    b = core.add(Request("b", ids[1], GREEDY))
    core.step()
    core.pause("wait")
    for _ in range(40):
        core.step()
    assert a.finish_reason is not None and b.finish_reason is None and not core.running  # b waited
    core.set_weight_version(3)
    core.resume()
    step_until_done(core, [b])
    assert a.completion().weight_version == 0 and b.completion().weight_version == 3
    assert b.completion().version_starts is None  # one version only

    core.add(Request("c", ids[2], GREEDY))
    core.add(Request("d", ids[3], GREEDY))
    core.step()
    core.pause("abort")
    assert not core.running and not core.waiting

    core.resume()
    e = core.add(Request("e", ids[2], SamplingParams(max_new_tokens=10, do_sample=False)))
    for _ in range(3):
        core.step()
    core.pause("in_place")
    core.step()  # paused in place: nothing moves
    assert len(e.tokens) == 3
    core.set_weight_version(4)
    core.resume()
    out = step_until_done(core, [e])[0]
    # the 4th token is sampled from logits the old weights computed before the pause: version 4's
    # tokens start at the 5th (tests/serve/test_serve.py checks the tokens against both models)
    assert out.weight_version == 4 and out.version_starts == [(0, 3), (4, 4)]


def test_the_trainer_batch_is_todays_batch(tiny):
    """A batch submitted at once (the synchronous trainer) samples exactly what one batched call
    sampled before the core: the uniforms of row r of the whole batch at each token. Here: rows
    named by row_ids in a 8-wide draw equal the same rows run in another order and alone."""
    model, tokenizer = tiny
    ids = prompt_ids(tokenizer)
    engine = NativeRollout(model, tokenizer, RolloutConfig(), 32)
    params = SamplingParams(max_new_tokens=12, seed=3, row_ids=(5, 1, 7, 2), total_rows=8)
    batch = engine.generate(ids, params)
    for r, row in enumerate(params.row_ids):
        alone = engine.core.run([Request("x", ids[r], SamplingParams(max_new_tokens=12, seed=3), row=row, width=8)])[0]
        assert alone.token_ids == batch[r].token_ids


def test_a_request_longer_than_max_model_len_is_refused(tiny):
    """rollout.max_model_len with vLLM's meaning: prompt + max_new_tokens at most that many."""
    model, tokenizer = tiny
    engine = NativeRollout(model, tokenizer, RolloutConfig(max_model_len=40), 32)
    prompt = prompt_ids(tokenizer)[0]  # 30 tokens or so
    fits = 40 - len(prompt)
    assert engine.core.add(Request("ok", prompt, SamplingParams(max_new_tokens=fits))).finish_reason is None
    with pytest.raises(ValueError, match=rf"request long: {len(prompt)} prompt tokens \+ max_new_tokens {fits + 1} = 41 "
                                         r"is more than max_model_len 40"):
        engine.core.add(Request("long", prompt, SamplingParams(max_new_tokens=fits + 1)))


def test_a_prompt_prefilled_in_chunks_decodes_as_one_prefill(tiny, monkeypatch):
    """Prompts of ~30-40 tokens prefilled 7 columns at a time (left padding and all, with a second
    request joining a running one) give generate()'s greedy tokens."""
    monkeypatch.setattr("rlvr.rollout.core.PREFILL_CHUNK", 7)
    model, tokenizer = tiny
    core, engine = core_of(model, tokenizer)
    ids = prompt_ids(tokenizer)
    calls = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: calls.append(k["input_ids"].shape[1]) or forward(*a, **k))
    first = core.add(Request("a", ids[0], GREEDY))
    core.step()
    assert calls == [7] * (len(ids[0]) // 7) + ([len(ids[0]) % 7] if len(ids[0]) % 7 else [])  # chunks of 7
    rest = [core.add(Request(str(i), p, GREEDY)) for i, p in enumerate(ids[1:])]
    out = step_until_done(core, [first, *rest])
    for got, prompt in zip(out, ids):
        assert got.token_ids == reference_greedy(model, tokenizer, [prompt], 12, engine.eos_ids)[0]


def test_the_slab_stays_bounded_under_steady_traffic(tiny):
    """A request joins every other step for 60 requests, with budgets of 5-12 tokens, so rows
    keep overlapping and the shared column count grows with the steps (one a step; on a server,
    forever: growing alone took one to 24 GB). An admission drops the holes before it grows: the
    slab stays one context wide (longest prompt + longest budget) plus twice its reserve (budget
    + 1: the slack a compaction leaves, so that the next is a reserve's steps away)."""
    model, tokenizer = tiny
    core, engine = core_of(model, tokenizer, max_num_seqs=3)
    ids = prompt_ids(tokenizer)
    seqs = []
    for i in range(60):
        budget = 5 + (i * 3) % 8
        seqs.append(core.add(Request(str(i), ids[i % 4], SamplingParams(max_new_tokens=budget, do_sample=False))))
        core.step()
        core.step()
    step_until_done(core, seqs)
    assert core.slab.capacity <= max(map(len, ids)) + 12 + 2 * (12 + 1)  # 95 columns before the fix
    for seq in seqs[:4]:
        want = reference_greedy(model, tokenizer, [seq.request.prompt_ids], seq.budget, engine.eos_ids)[0]
        assert seq.tokens == want


def test_a_burst_is_prefilled_a_part_per_step_within_the_token_budget(tiny):
    """max_num_batched_tokens (vLLM's meaning: a step's tokens, one per running row plus the
    prompts it prefills): a burst of four distinct prompts enters over several steps, the first
    request's first token comes before the last is admitted, and every greedy completion is
    still generate()'s."""
    model, tokenizer = tiny
    ids = prompt_ids(tokenizer)
    lengths = [len(p) for p in ids]
    budget = lengths[0] + lengths[1]  # step 1: prompts 0 and 1; then one decode token per running row
    core, engine = core_of(model, tokenizer)
    core.max_num_batched_tokens = budget
    seqs = [core.add(Request(f"q{i}", p, GREEDY)) for i, p in enumerate(ids)]
    admitted = []
    while any(s.finish_reason is None for s in seqs):
        core.step()
        admitted.append(sum(1 for s in seqs if s.tokens))
    # step 1: prompts 0 and 1 fill the budget; step 2: 2 running rows leave budget - 2, which
    # prompt 2 fits and prompts 2 + 3 do not; step 3: 3 running rows leave budget - 3 for prompt 3
    assert lengths[2] <= budget - 2 < lengths[2] + lengths[3] and lengths[3] <= budget - 3, lengths
    assert admitted[:3] == [2, 3, 4]
    for seq, prompt in zip(seqs, ids):
        assert seq.tokens == reference_greedy(model, tokenizer, [prompt], 12, engine.eos_ids)[0]


def test_groups_read_their_prompt_once_and_decode_as_alone(tiny, monkeypatch):
    """Three prompts x 4 rows with budgets that differ inside each group (rows leave their group as
    they end), 8 rows at a time (the third group joins later, in columns of its own, beside the
    others' generated ones): the decode steps read each group's prompt once (counted), and every
    greedy completion equals generate() on its prompt alone; the log-probs equal those of the same
    run with every row reading its own copy."""
    monkeypatch.setattr("rlvr.rollout.core.SHARED_COLUMN_READS_MIN", 0)
    monkeypatch.setattr("rlvr.rollout.core.SHARED_PREFIX_MIN_TOKENS", 4)
    model, tokenizer = tiny
    ids = prompt_ids(tokenizer)[:3]
    budgets = [12, 5, 9, 12]

    def run(share):
        core, engine = core_of(model, tokenizer, max_num_seqs=8)
        core.share_prompts = share
        seqs = [core.add(Request(f"{g}.{j}", prompt, SamplingParams(max_new_tokens=budget, do_sample=False), group=g))
                for g, prompt in enumerate(ids) for j, budget in enumerate(budgets)]
        step_until_done(core, seqs)
        return seqs, core.shared_steps, engine

    shared, steps, engine = run(True)
    plain, plain_steps, _ = run(False)
    assert plain_steps == 0 and steps >= 10  # 12 decode steps of the first two groups, then the third's
    for seq, other in zip(shared, plain):
        g, j = map(int, seq.request.id.split("."))
        assert seq.tokens == reference_greedy(model, tokenizer, [ids[g]], budgets[j], engine.eos_ids)[0], seq.request.id
        torch.testing.assert_close(torch.tensor(seq.log_probs), torch.tensor(other.log_probs), atol=1e-5, rtol=0)


def test_many_prompts_prefill_in_row_chunks_as_one_forward(tiny, monkeypatch):
    """Past ``PREFILL_ROW_TOKENS`` prompt tokens, the prompts of one admission prefill a few whole
    rows per forward. Each row then samples what one forward over every row gives (the same
    tokens, log-probs within float rounding: a matmul's row count can change its blocking), for
    fresh prompts, for prompts that continue kept turns, and for the shared opening's
    continuation; greedy rows equal transformers' generate."""
    import rlvr.rollout.core as core_module

    model, tokenizer = tiny
    ids = prompt_ids(tokenizer)
    forward = model.forward
    rows_per_forward = []
    monkeypatch.setattr(model, "forward", lambda *a, **k: rows_per_forward.append(k["input_ids"].shape[0]) or forward(*a, **k))
    tools = [tokenizer.encode(f"<|im_start|>tool\nresult: {'7' * (1 + 2 * i)}<|im_end|>\n<|im_start|>assistant\n",
                              add_special_tokens=False) for i in range(len(ids))]

    def run(row_tokens, shared_opening):
        monkeypatch.setattr(core_module, "PREFILL_ROW_TOKENS", row_tokens)
        monkeypatch.setattr(core_module, "SHARED_PREFIX_MIN_TOKENS", 16 if shared_opening else 10 ** 9)
        engine = NativeRollout(model, tokenizer, RolloutConfig(), max_response_length=10)
        first = SamplingParams(max_new_tokens=10, seed=0, stop=("e", "a"))
        with engine.turn_cache():
            turn1 = engine.generate(ids, first)
            turn2 = engine.generate([p + c.token_ids + t for p, c, t in zip(ids, turn1, tools)],
                                    SamplingParams(max_new_tokens=10, seed=1))
        greedy = engine.generate(ids, SamplingParams(max_new_tokens=10, do_sample=False))
        return turn1 + turn2 + greedy, greedy

    for shared_opening in (False, True):
        rows_per_forward.clear()
        whole, _ = run(10 ** 9, shared_opening)
        assert max(rows_per_forward) == len(ids) == 4  # one forward took every prompt
        rows_per_forward.clear()
        chunked, greedy = run(1, shared_opening)  # a row a forward
        assert set(rows_per_forward) == {1} and len(rows_per_forward) >= 3 * len(ids)
        assert [c.token_ids for c in chunked] == [c.token_ids for c in whole]
        torch.testing.assert_close(torch.tensor(sum((c.log_probs for c in chunked), [])),
                                   torch.tensor(sum((c.log_probs for c in whole), [])), atol=1e-5, rtol=0)
    want = reference_greedy(model, tokenizer, ids, 10, NativeRollout(model, tokenizer, RolloutConfig(), 10).eos_ids)
    assert [c.token_ids for c in greedy] == want
