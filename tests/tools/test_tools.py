"""Tools: the calculator's exact arithmetic, the schema checks, @function_tool, the tools YAML
(verl's format) and its errors, the tool-call parsers and the fallback chat template."""

import asyncio
import json

import pytest

from rlvr.data.chat_template import TOOL_CHAT_TEMPLATE, ChatFormat, template_renders_tools
from rlvr.tools import (CalculatorTool, FunctionTool, OpenAIFunctionToolSchema, SchemaError, ToolConfigError,
                        ToolError, calculate, check_arguments, function_tool, load_tools)
from rlvr.tools.parsers import get_tool_parser

run = asyncio.run


@pytest.mark.parametrize("expression,value", [
    ("12 * 34", "408"),
    ("347 * 28 + 915", "10631"),  # 9716 + 915
    ("2 ** 100", str(2 ** 100)),  # big integers stay exact
    ("99999999999 * 99999999999", "9999999999800000000001"),
    ("7 / 2", "3.5"),
    ("1 / 3", "1/3"),  # not a terminating decimal: kept as a fraction
    ("0.1 + 0.2", "0.3"),  # decimals are exact fractions, not floats (0.30000000000000004)
    ("-(3 - 10) * 2", "14"),
    ("17 // 5 + 17 % 5", "5"),  # 3 + 2
    ("3 × 4 ÷ 6", "2"),
    ("2^10", "1024"),
    ("1,234 + 1", "1235"),
    ("1 ** 5000", "1"),  # 0, 1 and -1 to any power are one digit (they were refused as ~1,505 digits)
    ("(-1) ** 4001", "-1"),
    ("0 ** 4000", "0"),
])
def test_calculator_is_exact(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression,message", [
    ("__import__('os').system('ls')", "unsupported element Call"),
    ("x + 1", "unsupported element|cannot parse"),
    ("foo", "unknown name 'foo'"),
    ("1 / 0", "division by zero"),
    ("9 ** 9 ** 9", "digits"),
    ("2 ** 0.5", "whole-number exponents"),
    ("(1 + ", "cannot parse"),
    ("", "empty expression"),
    ("1" * 600, "longer than 500"),
    ("1e999 + 1", "too large to read"),  # a float literal that overflows: the model's error, not a tool bug
    ("2 ** 5000", "about 1505 digits"),
])
def test_calculator_errors_are_messages(expression, message):
    with pytest.raises(ToolError, match=message):
        calculate(expression)


def test_calculator_tool_executes_and_reports_errors():
    tool = CalculatorTool({"type": "native"}, None)
    assert tool.name == "calculator"
    instance = run(tool.create())
    assert run(tool.execute(instance, {"expression": "6 * 7"})) == ("42", 0.0, {})
    with pytest.raises(ToolError, match="division by zero"):
        run(tool.execute(instance, {"expression": "1/0"}))


def test_schema_validation_names_the_key():
    good = CalculatorTool.default_schema().to_dict()
    assert OpenAIFunctionToolSchema.from_dict(good).to_dict() == good  # round trip
    for mutate, message in (
        (lambda d: d.update(type="tool"), r"tool_schema.type: must be 'function'"),
        (lambda d: d["function"].pop("name"), r"function.name"),
        (lambda d: d["function"]["parameters"]["properties"]["expression"].update(type="text"),
         r"properties.expression.type: 'text' is not a JSON schema type"),
        (lambda d: d["function"]["parameters"].update(required=["nope"]), r"required: must list names"),
        (lambda d: d["function"].update(extra=1), r"unknown keys \['extra'\]"),
    ):
        bad = json.loads(json.dumps(good))
        mutate(bad)
        with pytest.raises(SchemaError, match=message):
            OpenAIFunctionToolSchema.from_dict(bad)


def test_check_arguments():
    schema = OpenAIFunctionToolSchema.from_dict({"type": "function", "function": {
        "name": "f", "description": "d", "parameters": {"type": "object", "properties": {
            "n": {"type": "integer"}, "mode": {"type": "string", "enum": ["a", "b"]}}, "required": ["n"]}}})
    assert check_arguments(schema, {"n": 3, "mode": "a"}) == []
    assert check_arguments(schema, {"mode": "a"}) == ["missing required argument 'n'"]
    assert check_arguments(schema, {"n": True}) == ["argument 'n' must be of type integer, got bool"]
    assert check_arguments(schema, {"n": 1, "mode": "c"}) == ["argument 'mode' must be one of ['a', 'b'], got 'c'"]
    assert check_arguments(schema, {"n": 1, "z": 0}) == ["unknown argument 'z' (expected ['mode', 'n'])"]
    assert check_arguments(schema, [1]) == ["arguments must be a JSON object, got list"]


@function_tool
def add(a: int, b: int = 0) -> str:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return str(a + b)


@function_tool(name="slow_upper")
async def upper(text: str):
    """Upper-case a text."""
    await asyncio.sleep(0)
    return text.upper(), 0.5, {"chars": len(text)}


def test_function_tool_builds_its_schema_from_the_signature():
    assert isinstance(add, FunctionTool) and add(2, 3) == "5"  # still callable as itself
    assert add.tool_schema.to_dict() == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "the first number"},
            "b": {"type": "integer", "description": "the second number"}}, "required": ["a"]}}}
    assert run(add.execute("i", {"a": 2, "b": 5})) == ("7", 0.0, {})  # sync: run in a thread
    assert upper.name == "slow_upper"
    assert run(upper.execute("i", {"text": "ab"})) == ("AB", 0.5, {"chars": 2})


def test_function_tool_refuses_untyped_or_undocumented_functions():
    def untyped(a):
        """Doc."""
    def undocumented(a: int):
        pass
    with pytest.raises(TypeError, match="parameter 'a' needs a type hint"):
        function_tool(untyped)
    with pytest.raises(TypeError, match="needs a docstring"):
        function_tool(undocumented)


def write(tmp_path, text, name="tools.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_tools_reads_verls_format_and_user_tools(tmp_path):
    user = write(tmp_path, "from rlvr.tools import function_tool\n\n@function_tool\ndef double(x: int) -> str:\n"
                 '    """Double a number."""\n    return str(2 * x)\n', "mine.py")
    path = write(tmp_path, f"""
tools:
  - class_name: rlvr.tools.calculator.CalculatorTool
    config: {{type: native}}
    tool_schema:
      type: function
      function:
        name: calc
        description: exact arithmetic
        parameters: {{type: object, properties: {{expression: {{type: string}}}}, required: [expression]}}
  - class_name: {user}:double
""")
    tools = load_tools(path)
    assert sorted(tools) == ["calc", "double"]
    assert isinstance(tools["calc"], CalculatorTool)  # the YAML's schema renames it
    assert run(tools["double"].execute("i", {"x": 4}))[0] == "8"
    assert sorted(load_tools("calculator")) == ["calculator"]  # a shipped file by name


@pytest.mark.parametrize("text,message", [
    ("tools:\n  - class_name: no.such.Module\n", r"tools\[0\].class_name: cannot import 'no.such.Module': ModuleNotFoundError"),
    ("tools:\n  - class_name: rlvr.tools.calculator.Nope\n", r"has no attribute 'Nope'"),
    ("tools:\n  - class_name: json.dumps\n", r"neither a BaseTool subclass nor a @function_tool"),
    ("tools:\n  - class_name: calculator\n    tool_schema: {type: function, function: {name: 'bad name!'}}\n",
     r"tools\[0\].tool_schema.function.name"),
    ("tools:\n  - class_name: calculator\n    config: {type: mcp}\n", r"config.type: 'mcp' is not supported"),
    ("tools:\n  - class_name: calculator\n  - class_name: calculator\n", r"tools\[1\]: a second tool named 'calculator'"),
    ("tools: []\n", "non-empty list under 'tools:'"),
    ("tools:\n  - {config: {}}\n", r"tools\[0\]: each tool needs a class_name"),
    ("tools:\n  - class_name: rlvr.tools.base.BaseTool\n", r"building 'rlvr.tools.base.BaseTool' failed: BaseTool needs a tool_schema"),
])
def test_bad_tool_configs_name_the_file_and_tool(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ToolConfigError, match=message) as err:
        load_tools(path)
    assert str(path) in str(err.value)


def test_missing_tool_config_file(tmp_path):
    with pytest.raises(ToolConfigError, match="does not exist"):
        load_tools(tmp_path / "nope.yaml")
    with pytest.raises(ToolConfigError, match="is a folder, not a tools YAML"):
        load_tools(tmp_path)


def test_a_shipped_tools_name_is_not_shadowed_by_a_folder_of_that_name(tmp_path, monkeypatch):
    """`rlvr prepare calculator` makes ~/data/calculator/; run from ~/data, the recipe's
    tool_config_path `calculator` still names the shipped file (it raised IsADirectoryError)."""
    (tmp_path / "calculator").mkdir()
    monkeypatch.chdir(tmp_path)
    assert sorted(load_tools("calculator")) == ["calculator"]


def test_verls_tools_carry_over():
    """verl's current tools return (instance_id, ToolResponse(text=...)) from create and a
    ToolResponse from execute: both work here; image or video answers are refused by name."""
    from rlvr.tools.base import ToolResponse

    assert ToolResponse(text="42") == "42" and ToolResponse(text="42").text == "42" and ToolResponse() == ""
    assert ToolResponse("7").text == "7"
    with pytest.raises(ValueError, match="image and video responses are not supported"):
        ToolResponse(text="see", image=[b"png"])


SCHEMAS = [CalculatorTool.default_schema(), add.tool_schema]


def test_hermes_parser():
    parser = get_tool_parser("hermes", SCHEMAS)
    assert parser.stop_strings() == ["</tool_call>"]
    calls = parser.parse('Let me compute.<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n'
                         '</tool_call>')
    assert [(c.name, json.loads(c.arguments), c.error) for c in calls] == [("calculator", {"expression": "1+1"}, None)]
    bad = parser.parse('<tool_call>{"name": "calculator", "arguments": {"expression": }</tool_call>')
    assert bad[0].error == "invalid_json" and "not valid JSON" in bad[0].message
    assert parser.parse('<tool_call>["calculator"]</tool_call>')[0].error == "invalid_json"
    assert parser.parse("no call here, or an unfinished <tool_call>{") == []
    as_string = parser.parse('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')[0]
    assert as_string.arguments == '{"a": 1}'  # already a JSON string: kept as text


def test_tag_parser():
    parser = get_tool_parser("tag", SCHEMAS)
    assert parser.stop_strings() == ["</calculator>", "</add>"]
    calls = parser.parse("<calculator> 12 * 34 </calculator>")
    assert (calls[0].name, json.loads(calls[0].arguments)) == ("calculator", {"expression": "12 * 34"})
    calls = parser.parse('<add>{"a": 1, "b": 2}</add>')  # several arguments: a JSON object
    assert json.loads(calls[0].arguments) == {"a": 1, "b": 2}
    assert json.loads(parser.parse("<add>3</add>")[0].arguments) == {"a": 3}  # the one required parameter, as an int
    two = OpenAIFunctionToolSchema.from_dict({"type": "function", "function": {"name": "pair", "description": "d",
        "parameters": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                       "required": ["a", "b"]}}})
    assert get_tool_parser("tag", [two]).parse("<pair>x</pair>")[0].error == "invalid_json"
    assert parser.parse("<other>1</other>") == []
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'"):
        get_tool_parser("xml", SCHEMAS)


CONVERSATION = [
    {"role": "system", "content": "Be exact."},
    {"role": "user", "content": "What is 12 * 34?"},
    {"role": "assistant", "content": "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12*34\"}}\n</tool_call>"},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "The answer is 408."},
]


@pytest.mark.parametrize("fmt", ["hermes", "tag"])
def test_fallback_template_lists_tools_and_is_prefix_preserving(tokenizer, fmt):
    assert not template_renders_tools(tokenizer)  # SmolLM2's template ignores tools
    chat = ChatFormat(tokenizer, [s.to_dict() for s in SCHEMAS], fmt)
    assert chat.template == TOOL_CHAT_TEMPLATE
    first = chat.render(CONVERSATION[:2], add_generation_prompt=True)
    assert "calculator" in first and first.endswith("<|im_start|>assistant\n")
    for k in range(1, len(CONVERSATION)):
        assert chat.render(CONVERSATION).startswith(chat.render(CONVERSATION[:k]))
    # the delta after a turn equals what the template renders for the whole conversation
    before = chat.render(CONVERSATION[:3])
    delta = tokenizer.decode(chat.tool_delta([CONVERSATION[3]]))
    assert before[:-len(chat.assistant_end)] + delta == chat.render(CONVERSATION[:4], add_generation_prompt=True)
    # the system prompt appears once, with the tools; a conversation without one gets a default
    assert chat.render(CONVERSATION).count("<|im_start|>system") == 1
    assert chat.render(CONVERSATION[1:]).startswith("<|im_start|>system\nYou are a helpful assistant.")


def test_tool_calls_in_messages_are_rendered_when_the_text_lacks_them(tokenizer):
    chat = ChatFormat(tokenizer, [s.to_dict() for s in SCHEMAS], "hermes")
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}]}
    text = chat.render([CONVERSATION[1], message])
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>' in text


def test_the_example_tools_load_and_keep_state_per_trajectory():
    from pathlib import Path

    tools = load_tools(Path(__file__).parents[2] / "examples" / "tools" / "tools.yaml")
    assert sorted(tools) == ["calculator", "convert_length", "guess"]
    assert run(tools["convert_length"].execute("i", {"value": 2.0, "unit": "km"}))[0] == "2000 m"
    guess = tools["guess"]

    async def play(seed):
        instance = await guess.create(f"t{seed}", seed=seed)
        target = guess._instances[instance]["target"]
        hints = [(await guess.execute(instance, {"n": n}))[0] for n in (target - 1, target)]
        reward = await guess.calc_reward(instance)
        await guess.release(instance)
        return hints, reward, instance in guess._instances

    assert run(play(3)) == (["higher", "correct"], 1.0, False)


HANGING_TOOL = """
import asyncio, threading
from rlvr.tools import function_tool

@function_tool
def hang(x: int) -> str:
    '''Block forever.'''
    threading.Event().wait()

loop = asyncio.new_event_loop()  # as the multi-turn rollout runs its tools
try:
    loop.run_until_complete(asyncio.wait_for(hang.execute("i", {"x": 1}), 0.2))
except asyncio.TimeoutError:
    print("timed out", flush=True)
loop.close()
"""


def test_a_sync_function_tool_that_blocks_forever_does_not_keep_the_process_alive(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "hang.py"
    script.write_text(HANGING_TOOL)
    try:  # an executor's threads are joined at exit: the process never ended
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not exit: the stuck call's thread is joined at exit")
    assert (done.returncode, done.stdout) == (0, "timed out\n"), done.stderr


def test_stuck_calls_of_a_sync_tool_are_capped():
    import threading

    from rlvr.tools import ToolBusyError

    release = threading.Event()

    def wait(x: int) -> str:
        """Wait for the test."""
        release.wait()
        return str(x)

    tool = FunctionTool(wait, {"max_stuck_calls": 2})
    threads = lambda: sum(t.name == "function_tool:wait" for t in threading.enumerate())  # noqa: E731

    async def calls():
        for x in (1, 2):  # both time out and stay stuck, each holding its thread
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(tool.execute("i", {"x": x}), 0.05)
        assert (tool.stuck, threads()) == (2, 2)
        with pytest.raises(ToolBusyError, match="wait has 2 earlier calls still running past their timeout"):
            await tool.execute("i", {"x": 3})
        assert threads() == 2  # the refused call started no thread
        release.set()
        for _ in range(500):  # the stuck calls return and free their places
            if tool.stuck == 0:
                break
            await asyncio.sleep(0.01)
        assert tool.stuck == 0
        return await tool.execute("i", {"x": 4})

    async def checked():
        try:
            return await calls()
        finally:
            release.set()  # a failing check must not leave threads blocked (asyncio.run would wait for them)

    assert run(checked()) == ("4", 0.0, {})
    with pytest.raises(ValueError, match="config.max_stuck_calls must be an integer >= 1, got 0"):
        FunctionTool(wait, {"max_stuck_calls": 0})


SYNC_TOOL = '''
from rlvr.tools import BaseTool, OpenAIFunctionToolSchema


class Lookup(BaseTool):
    def execute(self, instance_id, parameters, **kw):  # a plain def: the loop awaits its tuple
        return "x", 0.0, {}
'''

SYNC_INTERACTION = '''
from rlvr.tools.interaction import BaseInteraction


class Tutor(BaseInteraction):
    def generate_response(self, instance_id, messages, **kw):
        return True, "ok", 1.0, {}
'''


def test_a_tool_or_interaction_whose_methods_are_not_coroutines_is_refused_at_load(tmp_path):
    """rlvr awaits create/execute/calc_reward/release (and an interaction's start/generate/finalize);
    a plain ``def`` was loaded, and every call of the run became "Error: ... object tuple can't be
    used in 'await' expression" (one warning; training went on without a tool)."""
    from rlvr.tools.interaction import load_interactions

    write(tmp_path, SYNC_TOOL, "sync_tool.py")
    path = write(tmp_path, "tools:\n  - class_name: sync_tool.py:Lookup\n    tool_schema: {type: function, "
                 "function: {name: lookup, parameters: {type: object, properties: {}}}}\n")
    for instantiate in (True, False):  # config load checks the entry without building it
        with pytest.raises(ToolConfigError, match=r"tools\[0\].class_name: 'sync_tool.py:Lookup': execute is not a "
                                                  r"coroutine function .*async def"):
            load_tools(path, instantiate=instantiate)
    write(tmp_path, SYNC_INTERACTION, "sync_interaction.py")
    path = write(tmp_path, "interaction:\n  - name: tutor\n    class_name: sync_interaction.py:Tutor\n",
                 "interaction.yaml")
    with pytest.raises(ToolConfigError, match=r"entry 0: 'sync_interaction.py:Tutor': generate_response is not a "
                                              r"coroutine function"):
        load_interactions(str(path))
