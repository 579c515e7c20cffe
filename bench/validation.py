"""Greedy validation's generation (the built-in model on the arithmetic task's 300 test problems,
up to 128 tokens each, fp32) timed under this checkout and under others, each run in its own
process, the checkouts alternating; against the compute floor measured in the same run.

    .venv/bin/python bench/validation.py [--trees DIR,DIR] [--repeats 3]

``--trees``: other rlvr checkouts to time beside this one (e.g. the batch engine before the
engine core: ``git worktree add /tmp/before-core 74844a8``); they run on this environment's
packages. Prints each run's seconds, tokens sampled, prompt tokens prefilled and page faults, the
median ratio of every other checkout's seconds to this one's, and the floor: the projections'
FLOPs over the tokens each forward takes (2 x the layers' weights per token prefilled or decoded,
2 x the head's per token sampled; attention left out, so the floor is low) at the 2048^3 fp32
``torch.mm`` rate measured after each repeat.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from runs import at_least

HERE = Path(__file__).resolve().parents[1]
DATA = Path("~/data/arithmetic").expanduser()


def child(root: str) -> None:
    """Run in a fresh process under checkout ``root``: one warm-up, then the timed generation."""
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]  # this checkout's finder
    sys.path.insert(0, root)
    import rlvr
    from rlvr.config.schema import RolloutConfig
    from rlvr.data import RLHFDataset
    from rlvr.models import load_model_and_tokenizer
    from rlvr.rollout import NativeRollout, SamplingParams

    assert rlvr.__file__.startswith(root), f"imported {rlvr.__file__}, not the checkout at {root}"
    model, tokenizer = load_model_and_tokenizer("builtin")
    ids = RLHFDataset([DATA / "test.parquet"], tokenizer).prompt_ids
    engine = NativeRollout(model, tokenizer, RolloutConfig(), 128)
    engine.generate(ids[:16], SamplingParams(max_new_tokens=8, do_sample=False))  # weights packed, threads up
    before = dict(getattr(engine, "prefill_tokens", {"computed": 0}))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    out = engine.generate(ids, SamplingParams(max_new_tokens=128, do_sample=False))
    seconds = time.perf_counter() - start
    config = model.config
    print(json.dumps({
        "seconds": seconds, "prompts": len(ids), "sampled": sum(len(c.token_ids) for c in out),
        "prefilled": getattr(engine, "prefill_tokens", {"computed": 0})["computed"] - before["computed"],
        "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
        "tokens": [c.token_ids for c in out],
        "layer_weights": sum(p.numel() for p in model.model.layers.parameters() if p.dim() == 2),
        "head_weights": config.vocab_size * config.hidden_size}))


def mm_rate() -> float:
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    return 10 * 2 * 2048 ** 3 / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", default="", help="other checkouts, comma-separated")
    p.add_argument("--repeats", type=at_least(1), default=3)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child)
    if not (DATA / "test.parquet").exists():
        from rlvr.data.prepare import prepare_arithmetic

        prepare_arithmetic(DATA)
    trees = [str(HERE)] + [str(Path(t).resolve()) for t in args.trees.split(",") if t]
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    rates = []
    for r in range(args.repeats):
        for tree in (trees if r % 2 == 0 else trees[::-1]):
            done = subprocess.run([sys.executable, __file__, "--child", tree], capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{tree}: the run failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            runs[tree].append(result)
            print(f"repeat {r}, {tree}: {result['seconds']:.2f} s, {result['sampled']} tokens sampled, "
                  f"{result['prefilled']} prompt tokens prefilled, {result['faults']} page faults", flush=True)
        rates.append(mm_rate())
        print(f"  torch.mm 2048^3 fp32: {rates[-1] / 1e9:.0f} GFLOP/s", flush=True)
    mine = runs[str(HERE)]
    for tree in trees[1:]:
        same = all(a["tokens"] == b["tokens"] for a, b in zip(runs[tree], mine))
        ratios = [a["seconds"] / b["seconds"] for a, b in zip(runs[tree], mine)]
        print(f"{tree} / this checkout: median {statistics.median(ratios):.2f}x the seconds "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}); same tokens: {same}")
    last = mine[-1]
    forwarded = last["prefilled"] + last["sampled"] - last["prompts"]  # a row's last token is never fed back
    flops = 2 * last["layer_weights"] * forwarded + 2 * last["head_weights"] * last["sampled"]
    floor = flops / statistics.median(rates)
    best = min(m["seconds"] for m in mine)
    print(f"floor: {flops / 1e12:.2f} TFLOP ({forwarded} tokens through the layers, {last['sampled']} through the "
          f"head) at the median torch.mm rate {statistics.median(rates) / 1e9:.0f} GFLOP/s = {floor:.1f} s; this "
          f"checkout's median {statistics.median(m['seconds'] for m in mine):.1f} s (best {best:.1f} s, "
          f"{floor / best:.0%} of the floor's speed)")


if __name__ == "__main__":
    main()
