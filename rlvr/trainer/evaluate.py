"""Scoring a policy on a prepared split: the trainer's validation and ``rlvr eval`` share it.

``evaluate`` generates ``n`` responses per prompt with any ``generate_sequences`` callable
(the worker group's during training, a bare rollout engine in ``rlvr eval``), scores them
with a reward manager and reports ``val-core/<data_source>/reward/{mean,best,maj}@n``;
``best@n`` is pass@n for 0/1 rewards. As in training, a reward that is not a number (NaN, inf,
None) or whose function raised or timed out has a placeholder score, ``reward.failure_score``,
and it counts in these means as that score (at the default 0, a 0/1 scorer's wrong answer);
how many there were is reported beside them, summed over the validation's batches:
``val-aux/reward/{num_invalid,num_errors,num_timeouts}`` and ``val-aux/reward/num_invalid/<data_source>``
(the training metrics' names under ``val-aux/``). A progress bar (stderr, as the training loop's) counts the
prompts scored, batch by batch, and while a batch generates it shows the rows the engine has
finished (``generating 37/300 rows``) with its elapsed time, redrawn every second (the default
job validates in one batch of 40-50 s).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable, Iterator

import numpy as np
from tqdm import tqdm

from rlvr.progress import listening
from rlvr.protocol import EPISODE_SAMPLE, DataProto, final_samples
from rlvr.trainer.metrics import multi_turn_stats, tool_tokens, validation_metrics

FAILURE_COUNTS = ("reward/num_invalid", "reward/num_errors", "reward/num_timeouts")
"""The reward manager's counts of samples with a placeholder score, reported for validation under ``val-aux/``."""
GENERATION_KEYS = ("input_ids", "attention_mask", "position_ids")
GENERATION_NON_TENSOR_KEYS = ("raw_prompt_ids", "raw_prompt", "tools_kwargs", "uid")
BATCH_SEED_STRIDE = 104_729  # batch seeds: seed + stride x first row (the first batch keeps the caller's seed)


AGENT_LOOP_COLUMNS = ("uid", "agent_name", "data_source", "reward_model", "extra_info")
"""Copied to the rollout as well (both keep them): an agent loop's ``kwargs`` are its row's columns."""


def generation_batch(batch: DataProto) -> DataProto:
    """The keys the rollout needs, popped from ``batch`` (``AGENT_LOOP_COLUMNS`` are copied)."""
    non_tensor = [k for k in GENERATION_NON_TENSOR_KEYS if k in batch.non_tensor_batch and k not in AGENT_LOOP_COLUMNS]
    gen = batch.pop(batch_keys=list(GENERATION_KEYS), non_tensor_batch_keys=non_tensor)
    for key in AGENT_LOOP_COLUMNS:
        if key in batch.non_tensor_batch:
            gen.non_tensor_batch[key] = batch.non_tensor_batch[key]
    return gen


@contextlib.contextmanager
def ticking(bar, every_s: float = 1.0) -> Iterator[None]:
    """Redraw ``bar`` every ``every_s`` seconds while the block runs: its elapsed time moves while
    a long batch generates (a disabled bar: nothing)."""
    if bar.disable:
        yield
        return
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            bar.refresh()
    thread = threading.Thread(target=tick, name="rlvr-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def evaluate(generate: Callable[[DataProto], DataProto], reward_fn, dataset, tokenizer, n: int,
             sampling: dict[str, Any], batch_size: int | None = None, seed: int = 0,
             reward_fn_key: str = "data_source", progress: str | None = None) -> dict[str, float]:
    """Generate ``n`` responses per prompt of ``dataset`` with ``sampling`` (meta_info overrides), score,
    report; ``progress`` names a progress bar of the prompts scored (None: no bar). The bar moves once
    per batch of ``batch_size`` prompts (None: the whole dataset in one batch), and says
    "generating", its elapsed time ticking, while a batch generates."""
    size = batch_size or len(dataset)
    sources, groups, scores, answers = [], [], [], []
    failures = dict.fromkeys(FAILURE_COUNTS, 0.0)  # summed over the batches, per data source too
    turns, counters, tool_token_counts = [], [], []  # multi-turn rollouts only
    bar = tqdm(total=len(dataset), desc=progress, unit="prompt", dynamic_ncols=True, leave=False,
               disable=progress is None)
    for start in range(0, len(dataset), size):
        rows = range(start, min(start + size, len(dataset)))
        batch = dataset.collate([dataset[i] for i in rows])
        batch.non_tensor_batch["uid"] = np.array([f"val-{start + i}" for i in range(len(batch))], dtype=object)
        gen = generation_batch(batch).repeat(n, interleave=True)
        # each batch its own seed: the engines number rows from 0 in every call, so with one seed row i
        # of every batch would draw the same uniforms (native) or the same request seed (vLLM)
        gen.meta_info.update(sampling, validate=True, seed=seed + BATCH_SEED_STRIDE * start)
        bar.set_postfix_str("generating", refresh=False)
        with ticking(bar), listening(lambda unit, done, total: unit == "rows" and bar.set_postfix_str(
                f"generating {done}/{total} rows", refresh=False)):  # the engine's count, drawn by the ticks
            out = generate(gen)
            out = out.select_idxs(final_samples(out))  # an agent's episode in samples: scored on its final context
            out.non_tensor_batch.pop(EPISODE_SAMPLE, None)
            batch = batch.repeat(n, interleave=True).union(out)
        result = reward_fn(batch)
        for key, value in result.metrics.items():
            if key.startswith(FAILURE_COUNTS):
                failures[key] = failures.get(key, 0.0) + value
        texts = [tokenizer.decode(r[m.bool()], skip_special_tokens=True).strip()
                 for r, m in zip(batch.batch["responses"], batch.batch["response_mask"])]
        preds = result.reward_extra_info.get("pred")
        sources += list(batch.non_tensor_batch[reward_fn_key])
        groups += list(batch.non_tensor_batch["uid"])
        scores += result.token_level_scores.sum(-1).tolist()
        answers += list(preds) if preds is not None else texts
        if "num_turns" in batch.non_tensor_batch:
            turns += list(batch.non_tensor_batch["num_turns"])
            counters += list(batch.non_tensor_batch["multi_turn_metrics"])
            tool_token_counts += tool_tokens(batch)
        bar.update(len(rows))
        bar.set_postfix(score=f"{np.mean(scores):.3f}")
    bar.close()
    metrics = validation_metrics(sources, groups, scores, answers)
    metrics.update({f"val-aux/{key}": value for key, value in failures.items()})
    if any(failures[key] for key in FAILURE_COUNTS):
        print(f"[rlvr] validation: of {len(scores)} samples, {failures['reward/num_invalid']:g} rewards were not "
              f"numbers, {failures['reward/num_errors']:g} raised and {failures['reward/num_timeouts']:g} timed out; "
              "each counts in val-core/.../mean@n as its placeholder score (reward.failure_score)",
              file=sys.stderr, flush=True)
    if turns:
        metrics.update(multi_turn_stats(turns, counters, tool_token_counts, prefix="val-aux/"))
    return metrics
