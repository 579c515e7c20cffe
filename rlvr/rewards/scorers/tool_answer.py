"""Scorer of the built-in tool task: the number the model's last turn settles on.

With tools, the response holds the calls and their results too, so "the last number in the
text" could be the calculator's output even when the model never answered. This scorer reads
the final assistant message of the conversation (``extra_info["messages"]``, set by the
multi-turn rollout): a trajectory that ends on a call or a tool result scores 0.
"""

from __future__ import annotations

from rlvr.rewards.scorers.arithmetic import compute_score as arithmetic_score


def final_answer_text(solution_str: str, extra_info: dict | None) -> str:
    messages = (extra_info or {}).get("messages")
    if not messages:
        return solution_str  # a single-turn rollout: the response is the answer
    last = messages[-1]
    return last["content"] if last["role"] == "assistant" and "</calculator>" not in last["content"] else ""


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    score = arithmetic_score(data_source, final_answer_text(solution_str, extra_info), ground_truth)
    used_tool = any(m["role"] == "tool" for m in (extra_info or {}).get("messages") or [])
    return {"score": score, "used_tool": float(used_tool), "correct_with_tool": float(score > 0 and used_tool)}
