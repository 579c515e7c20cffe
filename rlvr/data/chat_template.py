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
messages, and the next assistant header, so earlier turns are never re-tokenised. The tool
part is cut from a base conversation that ends in a user turn, not an assistant one: some
templates render the last assistant turn differently from earlier ones (Qwen3 gives it an
empty ``<think></think>`` block and drops it once a tool message follows), so a base ending in
an assistant turn is not a prefix of the longer conversation. The end of an assistant turn is
what the template renders between an assistant's text and the tool part. A template for which
either does not hold is not prefix-stable and is refused (``TemplateError``).

Tool output is text: it is tokenised with special-token parsing off, so a tool (or a model
that makes a tool echo its input) that prints ``<|im_end|>`` or ``<|im_start|>assistant`` does
not open or close turns; only the template's own text becomes special tokens.

Some templates print today's date (Llama-3.2/3.3, Granite and Mistral-Small call
``strftime_now``). Rendered on the real clock, a run that crosses midnight renders the tool
deltas' base, the dataset's prompts and the final conversation with different dates, so every
tool turn after midnight fails the prefix check. Every render here uses ``run_date()``, frozen
once per run and carried to worker processes in ``RLVR_CHAT_DATE``.
"""

from __future__ import annotations

import os
from datetime import datetime
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


CHAT_DATE_ENV = "RLVR_CHAT_DATE"


def run_date() -> datetime:
    """The date and time chat templates render for this run: read from ``RLVR_CHAT_DATE`` (ISO
    format), else the clock now, written there so that this process and the workers it starts
    keep rendering the same date after midnight."""
    if not os.environ.get(CHAT_DATE_ENV):
        os.environ[CHAT_DATE_ENV] = datetime.now().isoformat(timespec="seconds")
    return datetime.fromisoformat(os.environ[CHAT_DATE_ENV])


def frozen_date_kwargs(when: datetime | None = None) -> dict[str, Any]:
    """``apply_chat_template`` keyword arguments that make a template's ``strftime_now`` (a global
    transformers gives every template) format ``when`` (the run's date) instead of the clock."""
    when = when or run_date()
    return {"strftime_now": when.strftime}


TEMPLATE_ARGUMENTS = ("messages", "conversation", "tools", "tool_format", "chat_template", "tokenize",
                      "add_generation_prompt", "continue_final_message", "return_dict", "return_tensors",
                      "return_assistant_tokens_mask", "padding", "truncation", "max_length", "documents",
                      "strftime_now")
"""``apply_chat_template`` arguments rlvr sets itself: not template variables a config may give."""


def template_variables(tokenizer, template: str | None = None) -> set[str]:
    """The variables a chat template reads from outside (``template``, else the tokenizer's own; of a
    tokenizer with several, each one's)."""
    import jinja2
    from jinja2 import meta

    source = template or tokenizer.chat_template or ""
    sources = source.values() if isinstance(source, dict) else [source]
    return set().union(*(meta.find_undeclared_variables(jinja2.Environment().parse(s)) for s in sources))


class TemplateError(ValueError):
    """A chat template the tool loop cannot use (not prefix-stable, or a tool format it contradicts)."""


_FIX_TEMPLATE = ("give the model a template that renders a conversation's earlier turns the same whatever follows "
                 "(the chat_template of tokenizer_config.json in actor_rollout_ref.model.tokenizer_path, or the "
                 "model folder)")


def template_renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's own chat template reads the ``tools`` list."""
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default") or ""
    return bool(template) and "tools" in template


class ChatFormat:
    """Renders conversations with tools, with the tokenizer's template or the fallback one."""

    _BASE = [{"role": "user", "content": "U"}]
    _MARK = "RLVRASSISTANTTEXT"  # an assistant's text, to find where the template closes its turn

    def __init__(self, tokenizer, tools: Sequence[dict[str, Any]] | None = None, tool_format: str = "hermes",
                 chat_template: str | None = None, today: datetime | None = None,
                 template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})  # data.apply_chat_template_kwargs: every render
        self.today = today or run_date()  # what strftime_now renders: the base and every delta agree
        self.tools = list(tools) if tools else None
        self.tool_format = tool_format
        own = template_renders_tools(tokenizer)
        if chat_template is None and own and tool_format == "tag":
            raise TemplateError(
                "actor_rollout_ref.rollout.multi_turn.format=tag, but the tokenizer's chat template lists the tools "
                "itself and tells the model its own call format (Qwen-style templates: <tool_call>{json}</tool_call>), "
                "which the tag parser does not read; set actor_rollout_ref.rollout.multi_turn.format=hermes")
        self.template = chat_template or (None if own else TOOL_CHAT_TEMPLATE)
        self._special_ids = set(tokenizer.all_special_ids) | {
            i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self._base = self._probe(self._BASE)  # every tool delta is cut from it: it ends in a user turn
        self.assistant_end = self._assistant_end()  # closes an assistant turn, e.g. "<|im_end|>\n"

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tools=self.tools, chat_template=self.template,
                                                  tool_format=self.tool_format, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  **self.template_kwargs, **frozen_date_kwargs(self.today))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_text(self, text: str) -> list[int]:
        """Tokens of ``text`` read as plain text: special-token strings in it stay ordinary tokens."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:  # the tokenizer's own error for this is a bare TypeError
            raise ValueError(f"tool output {text[:80]!r} is not valid Unicode text ({err.reason} at character "
                             f"{err.start}), so it cannot be tokenised") from None
        ids = self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        special = sorted(set(ids) & self._special_ids)
        if special:
            raise TemplateError(f"tool output {text[:80]!r} tokenises to special tokens "
                                f"{self.tokenizer.convert_ids_to_tokens(special)} even as plain text")
        return ids

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True))

    def _after_base(self, tool_messages: Sequence[dict[str, Any]]) -> str:
        """What the template renders after the base for ``tool_messages`` and the next assistant header."""
        full = self._probe([*self._BASE, *tool_messages], add_generation_prompt=True)
        if not full.startswith(self._base):
            raise TemplateError(f"the chat template is not prefix-stable: adding a tool message changes the text "
                                f"rendered before it ({self._base!r} becomes {full[:len(self._base)]!r}), so tool "
                                f"results cannot be appended as tokens; {_FIX_TEMPLATE}")
        return full[len(self._base):]

    def _probe(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        """``render``, where a template that raises means it cannot serve the tool loop."""
        try:
            return self.render(messages, add_generation_prompt)
        except Exception as err:  # jinja raises: e.g. a template that allows no tool role
            raise TemplateError(f"the chat template cannot render {[m['role'] for m in messages]} "
                                f"({type(err).__name__}: {err}); {_FIX_TEMPLATE}") from None

    def _assistant_end(self) -> str:
        """The text between an assistant's last character and the tool messages that follow it."""
        probe = [{"role": "tool", "content": "T"}]
        after_user = self._after_base(probe)
        text = self._probe([*self._BASE, {"role": "assistant", "content": self._MARK}, *probe], True)
        after_mark = text[text.index(self._MARK) + len(self._MARK):] if self._MARK in text else ""
        if not after_mark.endswith(after_user):
            raise TemplateError(f"the chat template is not prefix-stable: tool messages render as {after_user!r} "
                                f"after a user turn but {after_mark!r} after an assistant's text; {_FIX_TEMPLATE}")
        return after_mark[:len(after_mark) - len(after_user)]

    def _tool_pieces(self, tool_messages: Sequence[dict[str, Any]]) -> list[tuple[str, bool]]:
        """The tool part after the base as (text, is_tool_content) pieces, in order. Each content
        is located by rendering it alone among placeholders, so a template that transforms it
        (Llama-3.1 quotes it as JSON) is followed exactly."""
        marks = [f"RLVRTOOLCONTENT{i}X" for i in range(len(tool_messages))]
        marked = [{**m, "content": mark} for m, mark in zip(tool_messages, marks)]
        skeleton = self._after_base(marked)
        pieces, rest = [], skeleton
        for i, (message, mark) in enumerate(zip(tool_messages, marks)):
            if skeleton.count(mark) != 1:
                raise TemplateError(f"the chat template renders a tool message's content {skeleton.count(mark)} "
                                    f"times (expected once); {_FIX_TEMPLATE}")
            before, _, rest = rest.partition(mark)
            head, tail = skeleton.split(mark)
            real = self._after_base([*marked[:i], message, *marked[i + 1:]])
            if not (real.startswith(head) and real.endswith(tail)):
                raise TemplateError(f"the chat template is not prefix-stable: tool output {message['content'][:80]!r} "
                                    f"changes the text around it; {_FIX_TEMPLATE}")
            pieces += [(before, False), (real[len(head):len(real) - len(tail)], True)]
        return pieces + [(rest, False)]

    def tool_delta(self, tool_messages: Sequence[dict[str, Any]], closed_by: str = "") -> list[int]:
        """Tokens after a model turn that ended with text ``closed_by`` (e.g. the end token it
        generated): the rest of the assistant turn's end, the tool messages, the next header.
        The template's text may hold special tokens; the tools' text never does."""
        end = self.assistant_end
        if closed_by and end.startswith(closed_by):
            end = end[len(closed_by):]
        ids = self.encode(end)
        for text, is_content in self._tool_pieces(tool_messages):
            ids += self.encode_text(text) if is_content else self.encode(text)
        return ids
