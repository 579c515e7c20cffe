"""verl's Gsm8kTool read as rlvr's own (rlvr/tools/gsm8k.py): verl's tools YAML builds it, and it scores
answers as verl's does (1.0 for the right number, a -0.05 step reward for a submission that does not improve)."""

import asyncio
from pathlib import Path

from rlvr.tools.config import load_tools
from rlvr.tools.gsm8k import Gsm8kTool

VERL_TOOLS_YAML = Path(__file__).parents[1] / "config/verl_scripts/multiturn/tool_config/gsm8k_tool_config.yaml"


def test_verls_tools_yaml_builds_rlvrs_gsm8k_tool():
    tools = load_tools(VERL_TOOLS_YAML)
    assert list(tools) == ["calc_gsm8k_reward"] and isinstance(tools["calc_gsm8k_reward"], Gsm8kTool)


def test_gsm8k_tool_scores_as_verls():
    tool = load_tools(VERL_TOOLS_YAML)["calc_gsm8k_reward"]

    async def episode():
        iid = await tool.create("r0", ground_truth="72")
        wrong = await tool.execute(iid, {"answer": "70"})
        right = await tool.execute(iid, {"answer": "72"})
        again = await tool.execute(iid, {"answer": "#### 72"})
        final = await tool.calc_reward(iid)
        await tool.release(iid)
        return wrong, right, again, final

    wrong, right, again, final = asyncio.run(episode())
    # 70 scores 0.0, not above the starting best 0.0: -0.05; 72 scores 1.0 > 0.0: no penalty;
    # 72 again is 1.0, not above the best 1.0: -0.05
    assert wrong == ("Current parsed answer='70' reward=0.0", -0.05, {})
    assert right == ("Current parsed answer='72' reward=1.0", 0.0, {})
    assert again[1] == -0.05 and final == 1.0
