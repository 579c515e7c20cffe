"""verl #6309 (https://github.com/verl-project/verl/issues/6309): a tool response exactly as long
as ``max_tool_response_length`` must reach the model whole; only a longer one is cut. An
off-by-one in the length check cuts answers that fit, silently: the model reads a marker and
loses the middle of a result it was allowed to see.

rlvr's key is ``actor_rollout_ref.rollout.multi_turn.max_tool_response_length`` (characters,
as in verl); the cut is ``rlvr.rollout.multi_turn.truncate_text``.
"""

import pytest

from rlvr.config import load_config
from rlvr.rollout.multi_turn import truncate_text
from tests.bugzoo.conftest import ScriptOnly
from tests.rollout.test_multi_turn import echo_text, make_rollout, prompts_for

LIMIT = 20
DIGITS = "0123456789" * 3  # character i is str(i % 10): a cut shows which characters survived
# one character over the limit, middle cut: 20 - len("...(truncated)") = 6 characters are kept,
# 3 from the head ("012") and 3 from the tail of the 21 characters (positions 18-20: "890")
CUT = "012...(truncated)890"


def shown_to_the_model(tiny, teacher_forced_engine, payload: str) -> str:
    """The model calls echo_text(payload), reads the result, answers: the tool message it was
    shown (its response holds exactly that message's tokens, with no loss on them)."""
    mt = load_config(None, [f"actor_rollout_ref.rollout.multi_turn.max_tool_response_length={LIMIT}"]
                     ).actor_rollout_ref.rollout.multi_turn
    call, answer = f"<echo_text>{payload}</echo_text>", "Done.<|im_end|>"

    def script(context):
        return answer if "<|im_start|>tool" in context else call

    rollout, chat = make_rollout(tiny, lambda s: teacher_forced_engine(s, ScriptOnly), script,
                                 tools={"echo_text": echo_text}, max_len=96,
                                 max_tool_response_length=mt.max_tool_response_length,
                                 tool_response_truncate_side=mt.tool_response_truncate_side)
    out = rollout.generate_sequences(prompts_for(rollout, chat))
    shown = out.non_tensor_batch["messages"][0][1]["content"]
    call_ids, answer_ids = (tiny[1].encode(text, add_special_tokens=False) for text in (call, answer))
    delta = chat.tool_delta([{"role": "tool", "content": shown}])
    assert out.batch["responses"][0].tolist() == call_ids + delta + answer_ids  # one row: nothing padded
    assert out.batch["response_mask"][0].tolist() == [1] * len(call_ids) + [0] * len(delta) + [1] * len(answer_ids)
    return shown


def test_a_tool_response_at_its_limit_is_kept_whole_and_one_more_character_is_cut(tiny, teacher_forced_engine):
    """Fails when truncate_text's ``len(text) <= limit`` early return is removed (or made ``<``)."""
    assert shown_to_the_model(tiny, teacher_forced_engine, DIGITS[:LIMIT]) == "01234567890123456789"  # whole
    assert shown_to_the_model(tiny, teacher_forced_engine, DIGITS[:LIMIT + 1]) == CUT  # 20 characters


@pytest.mark.parametrize("side,cut", [("right", "...(truncated)567890"),  # keeps the last 6 of 21: positions 15-20
                                      ("left", "012345...(truncated)"),  # keeps the first 6 (verl's left)
                                      ("middle", CUT)])
def test_every_side_keeps_a_text_at_the_limit_and_cuts_one_over_it_to_the_limit(side, cut):
    """Fails when truncate_text's ``len(text) <= limit`` early return is removed (or made ``<``)."""
    assert truncate_text(DIGITS[:LIMIT], LIMIT, side) == DIGITS[:LIMIT]
    assert truncate_text(DIGITS[:LIMIT + 1], LIMIT, side) == cut
