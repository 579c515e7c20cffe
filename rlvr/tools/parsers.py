"""Tool-call parsers: find the calls in a model's turn.

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen, Hermes and
  most instruct models trained for tools). Arguments are kept as a JSON string, as OpenAI's
  API does; JSON that does not parse becomes an error message to the model (``invalid_json``).
- ``tag``: ``<calculator>12 * 34</calculator>``, the tool's name as the tag and its one
  argument as the text, for small models that do not write JSON reliably. The text fills the
  tool's single required parameter; a JSON object fills several.

Each parser's closing tag(s) are stop strings: generation pauses right after a call, so the
model never writes (hallucinates) the tool's answer itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from rlvr.tools.schema import OpenAIFunctionToolSchema


@dataclass
class ToolCall:
    name: str | None
    arguments: str  # a JSON object, as text
    error: str | None = None  # "invalid_json" when the call itself could not be read
    message: str | None = None  # what the model is told when there is an error


class ToolParser:
    name = ""

    def __init__(self, tools: Sequence[OpenAIFunctionToolSchema]):
        self.tools = {t.name: t for t in tools}

    def stop_strings(self) -> list[str]:
        raise NotImplementedError

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in one assistant turn, in order (empty: the turn is a final answer)."""
        raise NotImplementedError


TOOL_PARSERS: dict[str, type[ToolParser]] = {}


def register_tool_parser(name: str) -> Callable[[type[ToolParser]], type[ToolParser]]:
    def wrap(cls: type[ToolParser]) -> type[ToolParser]:
        if name in TOOL_PARSERS and TOOL_PARSERS[name] is not cls:
            raise ValueError(f"tool parser {name!r} is already registered")
        cls.name = name
        TOOL_PARSERS[name] = cls
        return cls
    return wrap


def get_tool_parser(name: str, tools: Sequence[OpenAIFunctionToolSchema]) -> ToolParser:
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool-call format {name!r}; known: {sorted(TOOL_PARSERS)}")
    return TOOL_PARSERS[name](tools)


@register_tool_parser("hermes")
class HermesParser(ToolParser):
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

    def stop_strings(self) -> list[str]:
        return ["</tool_call>"]

    def parse(self, text: str) -> list[ToolCall]:
        calls = []
        for body in self._CALL.findall(text):
            try:
                obj = json.loads(body.strip())
            except json.JSONDecodeError as err:
                calls.append(ToolCall(None, body.strip(), "invalid_json",
                                      f"the tool call is not valid JSON ({err.msg} at character {err.pos})"))
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                calls.append(ToolCall(None, body.strip(), "invalid_json",
                                      'a tool call must be a JSON object {"name": ..., "arguments": {...}}'))
                continue
            args = obj.get("arguments", obj.get("parameters", {}))
            calls.append(ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
        return calls


@register_tool_parser("tag")
class TagParser(ToolParser):
    def __init__(self, tools: Sequence[OpenAIFunctionToolSchema]):
        super().__init__(tools)
        names = "|".join(re.escape(n) for n in self.tools)
        self._call = re.compile(rf"<({names})>(.*?)</\1>", re.S)

    def stop_strings(self) -> list[str]:
        return [f"</{name}>" for name in self.tools]

    def parse(self, text: str) -> list[ToolCall]:
        calls = []
        for name, body in self._call.findall(text):
            body = body.strip()
            if body.startswith("{"):
                try:
                    obj = json.loads(body)
                except json.JSONDecodeError as err:
                    calls.append(ToolCall(name, body, "invalid_json", f"the arguments are not valid JSON ({err.msg})"))
                    continue
                calls.append(ToolCall(name, json.dumps(obj, ensure_ascii=False)))
                continue
            params = self.tools[name].function.parameters
            single = params.required if len(params.required) == 1 else list(params.properties)
            if len(single) != 1:
                calls.append(ToolCall(name, body, "invalid_json",
                                      f"{name} takes several arguments; write them as a JSON object"))
                continue
            value: object = body
            if params.properties[single[0]].type != "string":  # <echo>5</echo> for an integer parameter
                try:
                    value = json.loads(body)
                except json.JSONDecodeError:
                    pass  # left as text: the argument check tells the model the type it needs
            calls.append(ToolCall(name, json.dumps({single[0]: value}, ensure_ascii=False)))
        return calls
