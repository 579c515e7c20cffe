"""Agent rollout throughput: the example agent (``examples/agents/chat_agent.py``: two chat calls an
episode through the OpenAI gateway) on the built-in model and task, per request against rounds.

    .venv/bin/python bench/agents.py [--prompts 8] [--n 8] [--repeats 3]

Each repeat generates one training batch (8 arithmetic prompts x n=8 episodes, the default job's
sampling) twice, with ``multi_turn.schedule=request`` (each call a request to the engine core,
joining the running rows at its next step) and ``schedule=turn`` (rounds: the calls waiting go to
the engine together, and a call that is ready waits for the round under way), the order
alternating. It prints the model's sampled tokens/s of each and their ratio, then medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from runs import at_least

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=at_least(1), default=8)
    p.add_argument("--n", type=at_least(1), default=8)
    p.add_argument("--repeats", type=at_least(1), default=3)
    args = p.parse_args()
    from rlvr.config import load_config
    from rlvr.trainer.main import build_trainer

    config = load_config(None, [
        "actor_rollout_ref.rollout.agent.default_agent_loop=openai_agent", "data.return_raw_chat=true",
        f"actor_rollout_ref.rollout.agent.gateway.function={ROOT / 'examples/agents/chat_agent.py'}:agent",
        f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.rollout.n={args.n}",
        "data.max_response_length=128", "trainer.val_before_train=false", "trainer.logger=[]",
        "trainer.default_local_dir=/tmp/rlvr-bench-agents"])
    trainer = build_trainer(config, progress_bar=False)
    batches = iter(trainer._batches())
    multi_turn = trainer.config.actor_rollout_ref.rollout.multi_turn

    def timed(batch, schedule: str) -> tuple[float, int]:
        multi_turn.schedule = schedule  # read at each rollout
        _, gen = trainer._dispatch(batch, 1, 0)
        start = time.perf_counter()
        out = trainer.rollout_wg.generate_sequences(gen)
        return time.perf_counter() - start, int(out.batch["response_mask"].sum())

    warm_up = next(batches)[0]
    for schedule in ("request", "turn"):  # warm-up, not timed: the gateway's imports, the engine's first packing
        timed(warm_up.select_idxs(list(range(len(warm_up)))), schedule)
    rows = []
    for r in range(args.repeats):
        batch = next(batches)[0]
        order = ["request", "turn"] if r % 2 == 0 else ["turn", "request"]
        runs = {schedule: timed(batch.select_idxs(list(range(len(batch)))), schedule) for schedule in order}
        (wall_req, tok_req), (wall_turn, tok_turn) = runs["request"], runs["turn"]
        rows.append((tok_req / wall_req, tok_turn / wall_turn, (tok_req / wall_req) / (tok_turn / wall_turn)))
        print(f"repeat {r}: per request {tok_req / wall_req:.1f} model tok/s ({tok_req} tokens, {wall_req:.2f} s), "
              f"rounds {tok_turn / wall_turn:.1f} tok/s ({tok_turn} tokens, {wall_turn:.2f} s): {rows[-1][2]:.2f}x",
              flush=True)
    ratios = [row[2] for row in rows]
    print(f"median: per request {statistics.median(r[0] for r in rows):.1f} tok/s, rounds "
          f"{statistics.median(r[1] for r in rows):.1f} tok/s: {statistics.median(ratios):.2f}x "
          f"(range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
