"""rlvr's native rollout engine: the engine core (``core.py``) over any transformers causal LM,
driven as a client (submit every row, gather), built for GRPO's workload (every prompt
sampled n times).

What makes it faster than ``model.generate`` on that workload:

- **Continuous batching** (``core.py``): at most ``rollout.max_num_seqs`` rows run; a row that
  ends frees its slot for a waiting one between two decode steps.
- **Shared prompt prefill**: the distinct prompts admitted together (same ``uid``, else same
  tokens) are prefilled once, with logits only at the last position, and their keys and
  values copied to the n rows that sample from them; the opening the distinct prompts have
  in common (a system prompt) is prefilled once for all of them.
- **No cache concatenation**: keys and values are written in place into preallocated
  buffers (``slab.py``, ``kv_cache.py``).
- **No wasted decode work**: finished rows (EOS, stop string, length) leave the decode
  batch at once (the cache copy that costs is a few ms, less than decoding a dead row).
- **A lean decode step** for Llama-family models (``lean.py``).
- **Cheap sampling**: inverse-CDF sampling, one random number per row per step.
- **Turns continue their cache** (inside ``turn_cache()``, which the multi-turn loop enters):
  a completion that stopped keeps its keys and values until the next call, and a prompt that
  continues it (its tokens, then the tool's) prefills only the new tokens on top of them.

``generate`` is the request-level entry point (token ids in; token ids, log-probs and a
finish reason out) that a multi-turn loop can call to continue a conversation without
re-tokenising it; ``generate_sequences`` is the batch API the trainer calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import ctypes.util
import sys
from dataclasses import replace
from typing import Hashable, Sequence

import torch

from rlvr.config.schema import RolloutConfig
from rlvr.models.loader import DTYPES
from rlvr.progress import advance
from rlvr.rollout.base import BaseRollout, Completion, register_rollout
from rlvr.rollout.core import (  # noqa: F401 (re-exported: tests and callers name them here)
    EngineCore, KeptTurn, Request, common_prefix_length, fill_finished_slots, select_cache_rows, take_longest_prefix)
from rlvr.rollout.kv_cache import supports_preallocated
from rlvr.rollout.lean import LeanDecoder, supports_lean_decode
from rlvr.rollout.sampling import SamplingParams



def _load_libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _load_libc()


def decode_attention(device: torch.device):
    """On CUDA, attention without cuDNN's SDPA backend while decoding. cuDNN builds an execution
    plan for each new key length, which in decode is every step: 1.5 ms of host time per call,
    45% of a bf16 rollout of the default job on an H100 (torch 2.11's profiler, bench/gpu.py
    --parts profile); flash and memory-efficient attention need no plan."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def trim_heap() -> None:
    """Return the heap's free pages to the OS (glibc only; a no-op elsewhere).

    The decode loop frees buffers of a new size at every step (logits, cache rows after a
    row finishes); glibc keeps such memory mapped, so without a trim the process's resident
    memory on the rollout benchmark kept growing to 1.7-2.1 GB instead of 1.4 GB. One trim
    per cache compaction costs well under a millisecond.
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


@register_rollout("native")
class NativeRollout(BaseRollout):
    """Generates responses with a model it shares with the actor (or with the worker that gathers its
    weights, in ``rollout.dtype``), or a synced copy when the model's dtype is not ``rollout.dtype``."""

    def __init__(self, model, tokenizer, config: RolloutConfig, max_response_length: int,
                 max_prompt_length: int | None = None, device: torch.device | str | None = None):
        super().__init__(model, tokenizer, config, max_response_length, max_prompt_length, device)
        self.actor_model = model
        # "auto" is resolved by load_config; a config built directly leaves it: the model's own dtype
        dtype = model.dtype if config.dtype == "auto" else DTYPES[config.dtype]
        if model.dtype != dtype:  # a copy in the rollout dtype, synced by sync_weights()
            self.model = copy.deepcopy(model).eval()
            for p in self.model.parameters():  # buffers (rotary frequencies) keep their dtype, as
                p.data = p.data.to(dtype)  # transformers keeps them when it loads in bf16
        else:
            self.model = model  # shared: no copy, always the actor's (or the worker's gathered) weights
        self.lean = LeanDecoder(self.model) if config.lean_decode and supports_lean_decode(self.model) else None
        self.core = EngineCore(self.model, tokenizer, self.eos_ids, self.pad_id, config.max_num_seqs,
                               self.lean.step if self.lean is not None else None, config.max_model_len,
                               config.max_num_batched_tokens)
        self.core.share_prompts = self.lean is not None  # a group's prompt read once a decode step (CPU)
        self._turns = False  # inside turn_cache()

    @property
    def eos_ids(self) -> list[int]:
        return self._eos_ids

    @eos_ids.setter
    def eos_ids(self, ids) -> None:  # the core's end tokens follow (a test or a caller may set them)
        self._eos_ids = list(ids)
        if "core" in self.__dict__:
            self.core.eos_ids = frozenset(self._eos_ids)

    @property
    def prefill_tokens(self) -> dict[str, int]:
        """Prompt tokens prefilled, and taken from kept turns (the core's count)."""
        return self.core.prefill_tokens

    @contextlib.contextmanager
    def turn_cache(self):
        """Keep each stopped completion's keys and values for one call: a prompt in the next call
        that continues it prefills only its new tokens. Models with transformers' own cache
        (sliding windows, hybrids) keep nothing."""
        if not supports_preallocated(self.model.config):
            yield
            return
        self._turns = True
        try:
            yield
        finally:
            self._turns = False
            self.core.kept, self.core.keeping = [], None

    def sync_weights(self, version: int | None = None) -> None:
        """Copy the actor's weights into the rollout copy (only when the rollout has its own dtype)."""
        if version is not None:
            self.core.set_weight_version(version)
        if self.model is self.actor_model:
            return
        with torch.no_grad():
            for dst, src in zip(self.model.parameters(), self.actor_model.parameters()):
                dst.copy_(src)

    # ------------------------------------------------------------------ request level
    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 groups: Sequence[Hashable] | None = None, max_new_tokens: Sequence[int] | None = None) -> list[Completion]:
        """Sample one completion per prompt, as requests to the engine core, submitted together
        in this order (which fixes the core's batches: same seed, same run). Prompts with the
        same ``groups`` key (default: the same tokens) share one prefill. ``max_new_tokens``
        caps each row (at most ``params.max_new_tokens``), for requests with different budgets
        left. Row r draws the uniforms of its row in the whole batch (``row_ids``, else
        ``row_offset + r``), so its tokens do not depend on which other rows take part or on
        ``rollout.max_num_seqs``."""
        if not prompts:
            return []
        budgets = [min(int(b), params.max_new_tokens) for b in max_new_tokens] if max_new_tokens is not None \
            else [params.max_new_tokens] * len(prompts)
        rows = params.row_ids or tuple(range(params.row_offset, params.row_offset + len(prompts)))
        width = max(len(prompts), params.total_rows, max(rows) + 1)
        core = self.core
        if self._turns:  # the last call's turns: used now or dropped
            core.kept, core.keeping = core.keeping or [], []
        seqs = [core.add(Request(f"r{i}", list(p), replace(params, max_new_tokens=b),
                                 group=None if groups is None else ("g", groups[i]), row=row, width=width))
                for i, (p, b, row) in enumerate(zip(prompts, budgets, rows))]
        finished = 0
        with decode_attention(self.model.device):
            while any(s.finish_reason is None for s in seqs):
                finished += len(core.step())
                advance("rows", finished, len(prompts))  # drawn by the listener at its own rate
        core.kept = []
        core.release()
        trim_heap()  # the cache is gone now
        return [s.completion() for s in seqs]

    def session(self) -> "RequestSession":
        """Requests one at a time from coroutines (the multi-turn loop's per-request schedule)."""
        return RequestSession(self)

    def free_cache(self) -> None:
        """The core's cache is freed when a call returns; the packed vocabulary projection goes here."""
        self.core.release()
        if self.lean is not None:
            self.lean.release()


class RequestSession:
    """The engine core serving requests that coroutines on one event loop submit one at a time
    (the multi-turn loop's per-request schedule): ``await session.generate(...)`` adds a request
    and returns its completion; ``drive()`` steps the core while it has work and yields to the
    loop after each step, so a request submitted meanwhile (a tool has answered) joins the
    running rows at the next step instead of waiting for the slowest row of a turn. Stopped
    completions keep their keys and values for the session (``turn_cache``'s reuse): a request's
    next turn prefills only the tool's tokens. ``close()`` frees the cache.

    A request's uniforms are its row's (``row``, ``width``, ``params.seed``), as in ``generate``;
    which rows share a step follows when tools answer, which moves logits in their last bits only
    (``core.py``): the per-request schedule is not bitwise reproducible where tool latency varies."""

    def __init__(self, engine: NativeRollout):
        self.engine, self.core = engine, engine.core
        self.waiting: dict[str, "asyncio.Future"] = {}
        self.submitted = 0
        self.finished = 0
        self.work = asyncio.Event()  # set when a request arrives
        self.core.kept = []
        # a stopped turn is offered to the next prompt at once (models with transformers' own cache keep nothing)
        self.core.keeping = self.core.kept if supports_preallocated(engine.model.config) else None

    async def generate(self, prompt: Sequence[int], params: SamplingParams, *, row: int, width: int,
                       group: Hashable | None = None) -> Completion:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        rid = f"s{self.submitted}"
        self.submitted += 1
        self.waiting[rid] = future

        def finished(completion: Completion) -> None:
            self.finished += 1
            done = self.waiting.pop(rid, None)
            if done is not None and not done.done():
                done.set_result(completion)

        self.core.add(Request(rid, list(prompt), params, group=group, row=row, width=width, on_finish=finished))
        self.work.set()
        return await future

    def forget(self, context: Sequence[int]) -> None:
        """Drop the kept turns that ``context`` (a finished conversation) extends: nothing continues them."""
        context = tuple(context)
        self.core.kept[:] = [t for t in self.core.kept if not (len(t.ids) <= len(context) and context[:len(t.ids)] == t.ids)]

    async def drive(self) -> None:
        """Step the core whenever it has work, until cancelled; a failing step fails every waiting request."""
        try:
            with decode_attention(self.engine.model.device):
                while True:
                    if self.core.has_work():
                        self.core.step()
                        advance("rows", self.finished, max(self.submitted, 1))
                        await asyncio.sleep(0)  # the coroutines whose requests finished (or whose tools answered) run
                    else:
                        self.work.clear()
                        await self.work.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as err:
            for future in self.waiting.values():
                if future.done():
                    continue
                if isinstance(err, Exception):
                    future.set_exception(err)
                else:  # Ctrl-C: the requests are cancelled (a KeyboardInterrupt in each would leave the loop mid-cleanup)
                    future.cancel()
            self.waiting.clear()
            raise

    def close(self) -> None:
        """Abort what is left (a Ctrl-C, a failure), drop the kept turns, free the cache."""
        self.core.abort_all()
        self.core.kept, self.core.keeping = [], None
        self.core.release()
        trim_heap()
