"""Multi-turn rollout throughput on the built-in tool task: the calculator recipe's workload
(8 test prompts x n=8, two assistant turns, the tag format) with the built-in model, or with a
trained policy (``--model``: the calculator recipe's checkpoint calls the tool in every answer).

    .venv/bin/python bench/multi_turn.py [--model builtin] [--prompts 8] [--n 8] [--repeats 3] [--python-calls 10] [--tool-seconds S,...]

Prints, per repeat and as medians: the model's generated tokens/s under the per-request
schedule (``multi_turn.schedule=request``, the default: each request's next turn joins the
engine's running rows as soon as its own tool answers) against the turn-by-turn schedule
(``schedule=turn``: each turn waits for its slowest row, then every tool call runs), tokens/s
counting the tool and template tokens appended between turns too, and the tool-call rate;
then the turn-by-turn rollout with every turn prefilling its whole conversation (the engine's
kept turn cache off: what rlvr did before), and the prompt tokens each prefilled. The reference in the same run is the single-turn
engine on the same prompts without tools (the same number of samples; a model that does
not call a tool answers in one turn), so the ratio shows what the turn structure costs.
``--tool-seconds`` repeats the two schedules with each tool call answering that many seconds
late (a remote environment or a test suite instead of the in-process calculator; the turn
schedule still runs a turn's calls concurrently), to show how the per-request schedule's gain
grows with the time rows spend waiting on tools. Last, the latency of one sandboxed ``python``
call (a fresh process in its own namespaces) against one ``calculator`` call, the two built-in
tools. Run ``rlvr prepare calculator`` first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from rlvr.config.schema import DataConfig, MultiTurnConfig, RolloutConfig
from rlvr.data import RLHFDataset
from rlvr.models import load_model_and_tokenizer
from rlvr.rollout import MultiTurnRollout, NativeRollout, ToolSetup
from rlvr.tools import load_tools
from runs import at_least, comma_list

DATA = Path("~/data/calculator/test.parquet").expanduser()


def batch_of(dataset, prompts: int, n: int, seed: int):
    items = [dataset[i] for i in range(prompts)]
    batch = dataset.collate(items)
    batch.non_tensor_batch["uid"] = [f"p{i}" for i in range(prompts)]
    batch = batch.repeat(n, interleave=True)
    batch.meta_info["seed"] = seed
    return batch


def timed_multi_turn(multi, batch, schedule: str, keep_turns: bool = True):
    """(output, wall seconds, prompt tokens prefilled) of one multi-turn
    rollout under ``schedule``; without ``keep_turns`` (the turn schedule) each turn prefills its
    whole conversation."""
    engine = multi.engine
    multi.config = dataclasses.replace(multi.config, schedule=schedule)
    if not keep_turns:
        engine.turn_cache = contextlib.nullcontext  # the instance's, over the class's method
    before = engine.prefill_tokens["computed"]
    try:
        start = time.perf_counter()
        out = multi.generate_sequences(batch)
        wall = time.perf_counter() - start
    finally:
        vars(engine).pop("turn_cache", None)
    return out, wall, engine.prefill_tokens["computed"] - before


def timed_single_turn(engine, batch):
    """(output, wall seconds) of the single-turn engine on the same batch: the reference, no tools."""
    start = time.perf_counter()
    out = engine.generate_sequences(batch)
    return out, time.perf_counter() - start


def delay_tools(tools: dict, seconds: float) -> None:
    """Make every tool answer ``seconds`` late (0: as it is)."""
    for tool in tools.values():
        if seconds <= 0:
            vars(tool).pop("execute", None)  # the class's method again
            continue

        async def execute(instance_id, parameters, _tool=tool, _run=type(tool).execute, **kwargs):
            await asyncio.sleep(seconds)
            return await _run(_tool, instance_id, parameters, **kwargs)

        tool.execute = execute


def schedule_ratio(multi, batch, reverse: bool) -> tuple[float, float, float]:
    """(per request / turn by turn model tokens/s, per request seconds, turn by turn seconds)."""
    order = ["turn", "request"] if reverse else ["request", "turn"]
    runs = {schedule: timed_multi_turn(multi, batch, schedule) for schedule in order}
    (out, wall, _), (turn_out, wall_turn, _) = runs["request"], runs["turn"]
    tokens, turn_tokens = int(out.batch["response_mask"].sum()), int(turn_out.batch["response_mask"].sum())
    return (tokens / wall) / (turn_tokens / wall_turn), wall, wall_turn


def tool_call_latency(tool_name: str, arguments: dict, calls: int) -> float:
    """Median seconds of one call of a built-in tool."""
    tool = load_tools(tool_name)[tool_name]
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        asyncio.run(tool.execute("bench", arguments))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin",
                   help="the policy: builtin (untrained: a fifth to a third of its answers call the tool) or a "
                        "checkpoint's actor folder, e.g. the calculator recipe's after training (every answer calls it)")
    p.add_argument("--prompts", type=at_least(1), default=8)
    p.add_argument("--n", type=at_least(1), default=8)
    p.add_argument("--max-response-length", type=at_least(1), default=64)
    p.add_argument("--repeats", type=at_least(1), default=3)
    p.add_argument("--python-calls", type=at_least(0), default=10, help="calls of each tool timed (0: skip)")
    p.add_argument("--tool-seconds", type=comma_list(at_least(0, float)), default=[],
                   help="comma-separated delays added to every tool call, e.g. 0.5,2")
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, tokenizer = load_model_and_tokenizer(args.model)
    rollout_cfg = RolloutConfig(multi_turn=MultiTurnConfig(enable=True, tool_config_path="calculator", format="tag",
                                                           max_assistant_turns=2, max_tool_response_length=64))
    setup = ToolSetup.from_config(tokenizer, rollout_cfg)
    data_cfg = DataConfig(max_prompt_length=320, return_raw_chat=True)
    dataset = RLHFDataset([DATA], tokenizer, data_cfg, setup.chat)
    engine = NativeRollout(model, tokenizer, rollout_cfg, args.max_response_length)
    multi = MultiTurnRollout(engine, setup.tools, rollout_cfg.multi_turn, setup.chat, args.max_response_length)
    for schedule in ("request", "turn"):  # warm-up, not timed: both, as either runs first in a repeat
        timed_multi_turn(multi, batch_of(dataset, args.prompts, args.n, seed=10_000), schedule)
    ratios, rows, keep_ratios, schedule_ratios = [], [], [], []
    for r in range(args.repeats):
        batch = batch_of(dataset, args.prompts, args.n, seed=r)
        runs = {"request": lambda: timed_multi_turn(multi, batch, "request"),
                "turn": lambda: timed_multi_turn(multi, batch, "turn"),
                "turn, whole prefill": lambda: timed_multi_turn(multi, batch, "turn", keep_turns=False),
                "single-turn": lambda: timed_single_turn(engine, batch)}
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]  # alternate which runs first, the reference too
        done = {name: runs[name]() for name in order}
        out, wall, _ = done["request"]
        turn_out, wall_turn, prefilled_turn = done["turn"]
        _, wall_full, prefilled_full = done["turn, whole prefill"]
        single, single_wall = done["single-turn"]
        keep_ratios.append(wall_full / wall_turn)
        R = out.batch["responses"].shape[1]
        model_tokens = int(out.batch["response_mask"].sum())
        turn_tokens = int(turn_out.batch["response_mask"].sum())
        schedule_ratios.append((model_tokens / wall) / (turn_tokens / wall_turn))
        all_tokens = int(out.batch["attention_mask"][:, -R:].sum())
        calls = sum(c.get("tool_calls", 0) > 0 for c in out.non_tensor_batch["multi_turn_metrics"]) / len(out)
        single_tokens = int(single.batch["response_mask"].sum())
        ratio = (model_tokens / wall) / (single_tokens / single_wall)
        ratios.append(ratio)
        rows.append((model_tokens / wall, all_tokens / wall, single_tokens / single_wall, calls,
                     turn_tokens / wall_turn, wall))
        print(f"repeat {r}: per request {model_tokens / wall:.1f} model tok/s ({all_tokens / wall:.1f} incl. tool "
              f"tokens, {wall:.2f} s), turn by turn {turn_tokens / wall_turn:.1f} tok/s ({wall_turn:.2f} s): "
              f"{schedule_ratios[-1]:.2f}x | tool-call rate {calls:.2f} | single-turn {single_tokens / single_wall:.1f} "
              f"tok/s, ratio {ratio:.2f} | turn by turn, each turn prefilling its whole conversation: {wall_full:.2f} s, "
              f"{prefilled_full} prompt tokens prefilled against {prefilled_turn} ({wall_full / wall_turn:.2f}x the time)")
    med = [statistics.median(col) for col in zip(*rows)]
    print(f"median: per request {med[0]:.1f} model tok/s ({med[1]:.1f} incl. tool tokens), turn by turn {med[4]:.1f} "
          f"tok/s: {statistics.median(schedule_ratios):.2f}x (range {min(schedule_ratios):.2f}-{max(schedule_ratios):.2f}); "
          f"single-turn {med[2]:.1f} tok/s, per request / single-turn {statistics.median(ratios):.2f}; kept turn cache: "
          f"turn by turn {statistics.median(keep_ratios):.2f}x faster than prefilling each turn's whole conversation "
          f"(range {min(keep_ratios):.2f}-{max(keep_ratios):.2f})")
    for seconds in args.tool_seconds:
        delay_tools(multi.tools, seconds)
        per = [schedule_ratio(multi, batch_of(dataset, args.prompts, args.n, seed=r), reverse=bool(r % 2))
               for r in range(args.repeats)]
        delay_tools(multi.tools, 0)
        for r, (ratio, wall, wall_turn) in enumerate(per):
            print(f"tools {seconds:g} s late, repeat {r}: per request {wall:.2f} s, turn by turn {wall_turn:.2f} s: "
                  f"{ratio:.2f}x")
        ratios_s = [x[0] for x in per]
        print(f"tools {seconds:g} s late: per request / turn by turn {statistics.median(ratios_s):.2f}x "
              f"(range {min(ratios_s):.2f}-{max(ratios_s):.2f})")
    if args.python_calls:
        calc = tool_call_latency("calculator", {"expression": "347 * 28 + 915"}, args.python_calls)
        py = tool_call_latency("python", {"code": "print(347 * 28 + 915)"}, args.python_calls)
        print(f"one tool call (median of {args.python_calls}): calculator {calc * 1000:.2f} ms, sandboxed python "
              f"{py * 1000:.1f} ms")


if __name__ == "__main__":
    main()
