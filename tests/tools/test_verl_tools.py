"""A tool module written for verl (``from verl.tools.base_tool import BaseTool``, verl's schemas,
its ``rollout_trace_op``; an interaction on ``verl.interactions.base``) loads as an rlvr tool,
without verl and without the packages verl imports (datasets, langchain_core, tensordict); a
module that needs verl's own code, or a package that is not installed, fails naming it and the
pip command."""

import asyncio
import importlib.machinery
import sys

import pytest

from rlvr.tools import BaseTool, ToolConfigError, load_tools
from rlvr.tools.interaction import BaseInteraction, load_interactions

# as verl's own tools are written (verl/tools/gsm8k_tool.py)
VERL_STYLE_TOOL = '''
from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

SCHEMA = OpenAIFunctionToolSchema.model_validate({
    "type": "function",
    "function": {"name": "echo", "description": "Say it back.",
                 "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
})


class EchoTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema or SCHEMA)
        self._instance_dict = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instance_dict[instance_id] = {"calls": 0}
        return instance_id, ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        self._instance_dict[instance_id]["calls"] += 1
        return ToolResponse(text=parameters["text"]), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return float(self._instance_dict[instance_id]["calls"])
'''

VERL_STYLE_INTERACTION = '''
from verl.interactions.base import BaseInteraction


class AlwaysRight(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        return True, "right", 1.0, {}
'''


@pytest.fixture
def without_verl(monkeypatch):
    """rlvr's environment: no verl, and the packages verl imports absent (a None in sys.modules
    makes their import fail as a missing package's does). The modules made are dropped after."""
    if importlib.machinery.PathFinder.find_spec("verl") is not None:
        pytest.skip("verl is installed here: its packages import from it")
    for package in ("datasets", "langchain_core", "tensordict"):
        monkeypatch.setitem(sys.modules, package, None)
    yield
    for name in [name for name in sys.modules if name.split(".")[0] in ("verl", "verl_style_tools")]:
        del sys.modules[name]


def tools_yaml(tmp_path, class_name: str):
    path = tmp_path / "tools.yaml"
    path.write_text(f"tools:\n  - class_name: {class_name}\n    config: {{type: native}}\n")
    return path


@pytest.mark.parametrize("named", ["file", "module"])
def test_a_tool_written_for_verl_loads_and_runs_as_an_rlvr_tool(tmp_path, monkeypatch, without_verl, named):
    (tmp_path / "verl_style_tools.py").write_text(VERL_STYLE_TOOL)
    monkeypatch.syspath_prepend(str(tmp_path))
    class_name = "verl_style_tools.py:EchoTool" if named == "file" else "verl_style_tools.EchoTool"
    tools = load_tools(tools_yaml(tmp_path, class_name))
    echo = tools["echo"]
    assert isinstance(echo, BaseTool)  # rlvr's: verl's name stands for it
    instance = asyncio.run(echo.create())[0]  # verl's (instance_id, ToolResponse)
    text, reward, metrics = asyncio.run(echo.execute(instance, {"text": "hi"}))
    assert (text, reward, metrics) == ("hi", 0.0, {})
    assert asyncio.run(echo.calc_reward(instance)) == 1.0
    assert echo.tool_schema.model_dump()["function"]["parameters"]["required"] == ["text"]


def test_an_interaction_written_for_verl_loads(tmp_path, without_verl):
    (tmp_path / "verl_style_interaction.py").write_text(VERL_STYLE_INTERACTION)
    path = tmp_path / "interactions.yaml"
    path.write_text("interaction:\n  - name: judge\n    class_name: verl_style_interaction.py:AlwaysRight\n")
    judge = load_interactions(str(path))["judge"]
    assert isinstance(judge, BaseInteraction)
    assert asyncio.run(judge.generate_response("i", [])) == (True, "right", 1.0, {})


@pytest.mark.parametrize("imports, message", [
    ("from verl.utils.reward_score import gsm8k",
     "it imports verl.utils.reward_score, which is verl's own code: rlvr stands in only for verl's tool interface "
     "(verl.tools.base_tool, verl.tools.schemas, verl.utils.rollout_trace, verl.interactions.base); use rlvr's "
     "counterpart, or install verl (pip install verl)"),
    ("import datasets", "it imports datasets, and the package 'datasets' is not installed here (pip install datasets)"),
    ("from langchain_core.tools import tool",
     "it imports langchain_core.tools, and the package 'langchain_core' is not installed here (pip install langchain_core)"),
])
def test_a_tool_needing_what_is_not_installed_names_it_and_the_pip_command(tmp_path, without_verl, imports, message):
    (tmp_path / "needs_more.py").write_text(f"{imports}\n{VERL_STYLE_TOOL}")
    path = tools_yaml(tmp_path, "needs_more.py:EchoTool")
    with pytest.raises(ToolConfigError) as err:
        load_tools(path)
    assert str(err.value) == f"{path}: tools[0].class_name: cannot import 'needs_more.py:EchoTool': {message}"
