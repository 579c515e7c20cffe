"""An agent of your own, trained by rlvr on the tokens it was sampled (docs/agents.md).

    rlvr train actor_rollout_ref.rollout.agent.default_agent_loop=openai_agent \
        actor_rollout_ref.rollout.agent.gateway.function=examples/agents/chat_agent.py:agent \
        data.return_raw_chat=true

It answers the arithmetic task, checks its answer once when asked, and scores itself.
"""

import re

import openai


async def agent(base_url: str, api_key: str, row: dict) -> float:
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        messages = list(row["raw_prompt"])
        answer = await client.chat.completions.create(model="rlvr-policy", messages=messages, max_tokens=64)
        messages += [{"role": "assistant", "content": answer.choices[0].message.content},
                     {"role": "user", "content": "Check it, then give the final number alone."}]
        final = await client.chat.completions.create(model="rlvr-policy", messages=messages, max_tokens=32)
    numbers = re.findall(r"-?\d+", final.choices[0].message.content or "")
    return float(bool(numbers) and numbers[-1] == str(row["reward_model"]["ground_truth"]))
