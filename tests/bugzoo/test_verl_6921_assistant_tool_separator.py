"""verl #6921 (https://github.com/verl-project/verl/pull/6921): a multi-turn rollout builds its
tokens turn by turn. The model stops at its own ``<|im_end|>`` and never writes the template's
"\\n" after it; the tool turn, rendered alone, starts at ``<|im_start|>``; so the separator was
lost at every assistant-to-tool boundary, and the trained tokens were not what the chat template
renders for the conversation (a train/inference mismatch that grows with each turn).

Here the rollout's prompt + response tokens must equal the template's rendering of the whole
conversation, token for token, under rlvr's fallback template (SmolLM2's own ignores tools) and
Qwen2.5's, whether the model's turn ends at the call's stop string or at its own end token; and
the tokens between the model's turns carry no loss.
"""

import pytest

from rlvr.config.schema import MultiTurnConfig, RolloutConfig
from rlvr.data.chat_template import TOOL_CHAT_TEMPLATE, ChatFormat
from rlvr.rollout import MultiTurnRollout
from tests.bugzoo.conftest import ScriptOnly
from tests.data.test_chat_template import QWEN25
from tests.rollout.test_multi_turn import QUESTION, echo_text, prompts_for

CALL = '<tool_call>\n{"name": "echo_text", "arguments": {"text": "408"}}\n</tool_call>'
ANSWER = "The answer is 408.<|im_end|>"


# After the call, each template renders (written by hand from its text) the end of the assistant
# turn "<|im_end|>\n", the tool turn, and the next assistant header. When the model wrote the
# "<|im_end|>" itself (one token, one of its own: trained on), the rollout appends the rest,
# "\n<|im_start|>...": that "\n" is the separator verl dropped.
BOUNDARY = {None: "<|im_end|>\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n",
            QWEN25: "<|im_end|>\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n"}


@pytest.mark.parametrize("template", [None, QWEN25], ids=["fallback", "qwen2.5"])
@pytest.mark.parametrize("model_ends_its_turn", [False, True], ids=["at-stop-string", "at-own-im_end"])
def test_the_assistant_to_tool_boundary_is_what_the_template_renders(tiny, tokenizer, teacher_forced_engine,
                                                                     template, model_ends_its_turn):
    """Fails when ChatFormat.tool_delta drops the rest of the assistant turn's end after the
    model's own end token (``end = end[len(closed_by):]`` made ``end = ""``), or doubles it
    (the ``closed_by`` strip removed)."""
    call = CALL + "<|im_end|>" if model_ends_its_turn else CALL

    def script(context):  # the call, then (in the second assistant turn, after the result) the answer
        return ANSWER if context.count("<|im_start|>assistant") == 2 else call

    tools = {"echo_text": echo_text}
    chat = ChatFormat(tokenizer, [t.tool_schema.to_dict() for t in tools.values()], "hermes", chat_template=template)
    engine = teacher_forced_engine(script, ScriptOnly)(tiny[0], tokenizer, RolloutConfig(), 96)
    rollout = MultiTurnRollout(engine, tools, MultiTurnConfig(enable=True, format="hermes"), chat, 96)
    out = rollout.generate_sequences(prompts_for(rollout, chat))
    conversation = QUESTION + list(out.non_tensor_batch["messages"][0])
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "assistant"]

    rendered = tokenizer.apply_chat_template(conversation, tools=chat.tools, tool_format="hermes", tokenize=False,
                                             chat_template=template or TOOL_CHAT_TEMPLATE)
    expected = tokenizer.encode(rendered, add_special_tokens=False)
    assert out.batch["attention_mask"][0].all()  # one row: nothing padded
    # prompt + response; the template closes the last turn with "<|im_end|>\n", the model stopped at "<|im_end|>"
    assert out.batch["input_ids"][0].tolist() == expected[:-1] and tokenizer.decode(expected[-1:]) == "\n"

    call_ids = tokenizer.encode(call, add_special_tokens=False)
    delta = tokenizer.encode(BOUNDARY[template], add_special_tokens=False)
    delta = delta[1:] if model_ends_its_turn else delta  # the "<|im_end|>" is then the model's
    answer_ids = tokenizer.encode(ANSWER, add_special_tokens=False)
    assert out.batch["responses"][0].tolist() == call_ids + delta + answer_ids
    assert out.batch["response_mask"][0].tolist() == [1] * len(call_ids) + [0] * len(delta) + [1] * len(answer_ids)
