"""Chat formatting for multi-turn tool use: which template renders tools, and the token
deltas a rollout appends between the model's turns.

Many small models' templates ignore ``tools`` and ``tool_calls`` (SmolLM2's does). For
those, rlvr renders with ``TOOL_CHAT_TEMPLATE``: ChatML like SmolLM2's, with the tool list
and the call format appended to the system prompt, an assistant's text as is (its tool calls
are in its text) and ``role: tool`` messages as turns of their own. It is prefix-preserving:
rendering a conversation and then a longer one gives the first as a prefix of the second,
which is what lets a rollout append tool results as a token delta.

``ChatFormat.tool_delta`` gives the tokens that follow a model's turn when tool results
arrive: the template's end of the assistant turn (unless the model wrote it), the tool
messages, and the next assistant header, computed from the template itself on a dummy
conversation, so earlier turns are never re-tokenised.
"""

from __future__ import annotations

from typing import Any, Sequence

TOOL_CHAT_TEMPLATE = (
    "{%- set tool_text = '' -%}"
    "{%- if tools -%}"
    "{%- if tool_format == 'tag' -%}"
    "{%- set ns = namespace(text='\\n\\n# Tools\\n\\nTo use a tool, write <NAME>argument</NAME>; the result comes back "
    "in a tool message. Tools:') -%}"
    "{%- for tool in tools -%}{%- set ns.text = ns.text + '\\n- ' + tool.function.name + ': ' "
    "+ tool.function.description -%}{%- endfor -%}"
    "{%- set tool_text = ns.text -%}"
    "{%- else -%}"
    "{%- set ns = namespace(text='\\n\\n# Tools\\n\\nYou may call the functions below. Write each call as a JSON object "
    "inside <tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call>\\n\\n<tools>') -%}"
    "{%- for tool in tools -%}{%- set ns.text = ns.text + '\\n' + (tool | tojson) -%}{%- endfor -%}"
    "{%- set tool_text = ns.text + '\\n</tools>' -%}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.' + tool_text + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'system' -%}"
    "{{ '<|im_start|>system\\n' + message['content'] + (tool_text if loop.first else '') + '<|im_end|>\\n' }}"
    "{%- else -%}"
    "{%- set msg = namespace(content=message['content'] or '') -%}"
    "{%- if message['role'] == 'assistant' and message.get('tool_calls') and '<tool_call>' not in msg.content -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set msg.content = msg.content + '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", "
    "\"arguments\": ' + call['function']['arguments'] + '}\\n</tool_call>' -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + msg.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def template_renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's own chat template reads the ``tools`` list."""
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default") or ""
    return bool(template) and "tools" in template


class ChatFormat:
    """Renders conversations with tools, with the tokenizer's template or the fallback one."""

    _DUMMY = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]

    def __init__(self, tokenizer, tools: Sequence[dict[str, Any]] | None = None, tool_format: str = "hermes",
                 chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.tool_format = tool_format
        self.template = chat_template or (None if template_renders_tools(tokenizer) else TOOL_CHAT_TEMPLATE)
        self._dummy = self.render(self._DUMMY)  # the base every tool delta is cut from
        self.assistant_end = self._dummy[self._dummy.rindex("A") + 1:]  # closes an assistant turn, e.g. "<|im_end|>\n"

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tools=self.tools, chat_template=self.template,
                                                  tool_format=self.tool_format, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True))

    def tool_delta(self, tool_messages: Sequence[dict[str, Any]], closed_by: str = "") -> list[int]:
        """Tokens after a model turn that ended with text ``closed_by`` (e.g. the end token it
        generated): the rest of the assistant turn's end, the tool messages, the next header."""
        full = self.render([*self._DUMMY, *tool_messages], add_generation_prompt=True)
        end = self.assistant_end
        if closed_by and end.startswith(closed_by):
            end = end[len(closed_by):]
        return self.encode(end + full[len(self._dummy):])
