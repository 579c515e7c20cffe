"""The reward manager: responses in, ``token_level_scores`` out.

For each sample it decodes the response, picks the reward function(s) — one custom
function, a weighted list (``reward.functions``), or the scorer of the row's data_source —
calls it by keyword as verl does (``fn(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)``) and writes the score on the response's last valid token (zeros elsewhere),
as verl does. Dict results add extra values: ``reward_extra_info`` arrays (one entry per row)
and per-step metrics; an extra named like a column the batch has (``uid``) is refused. The
working directory is put back after each call.

Robustness: a score that is not a number (NaN, inf, None, a string, an int beyond float) is never given one: the sample is
counted (``reward/num_invalid``, and per data source) and its whole group is left out of the
update (``reward.on_invalid=drop``; ``raise`` stops the run). Every sample is scored under a
time limit (``reward.timeout_s``). A function that raises or runs out of time gives that sample
``reward.failure_score`` and is counted in
``reward/num_errors`` / ``reward/num_timeouts`` (the first failure of a step is printed with
its sample), or fails the step when ``reward.on_error=raise``; a function that calls ``sys.exit()``
has failed on that sample too. A score beyond ±1.8e19 (``MAX_SCORE``) is invalid, as NaN is: the
scores are float32 and a group's variance of it would overflow. A batch where more than
``reward.max_failed_fraction`` of the samples failed stops the run with the first failure. The
time limit is a POSIX timer of rlvr's own that sends ``TIMEOUT_SIGNAL`` (SIGUSR2) to the scoring
thread: not SIGALRM, whose timer the code being timed can clear (``signal.alarm(0)``; math-verify
does), and not a watchdog thread, which could not run while a C call (a backtracking regex) holds
the GIL. Python runs signal handlers in the main thread only: scored from another thread with
``reward.num_workers = 0``, the samples go to a one-process pool, where it acts. With
``reward.num_workers > 0`` samples are scored in a process pool, whose processes import the
functions when they start (outside any sample's limit); a worker stuck in C code that ignores the
signal is killed with the pool, and the pool is rebuilt for the next call. The other samples keep
their scores.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import importlib
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.algos.dapo import overlong_penalty
from rlvr.config.schema import RewardConfig
from rlvr.protocol import DataProto
from rlvr.registry import import_file, import_file_as
from rlvr.errors import StopTraining
from rlvr.rewards.registry import REWARD_FNS, reward_fn_name_for


POOL_GRACE_S = 10.0  # beyond the samples' own time limits, how long the pool may take before it counts as stuck
# scores are float32, and a group's std squares them: beyond sqrt(float32 max) = 1.8e19 the variance is
# inf and the group's advantages silently 0 (beyond 3.4e38 the score does not even fit the tensor)
MAX_SCORE = math.sqrt(float(torch.finfo(torch.float32).max))


class RewardError(StopTraining):
    """A reward function failed and ``reward.on_error=raise``, or the reward config is wrong."""


@dataclass(frozen=True)
class FnRef:
    """A picklable reference to a reward function: a module attribute or a function in a file."""

    name: str
    module: str | None = None
    qualname: str | None = None
    path: str | None = None
    kwargs: tuple = ()
    module_file: str | None = None
    """The file of ``module``, for a module that is not importable by name (a file of custom_modules)."""

    @classmethod
    def of(cls, name: str, fn) -> "FnRef":
        return cls(name, module=fn.__module__, qualname=fn.__qualname__,
                   module_file=getattr(sys.modules.get(fn.__module__), "__file__", None))

    def resolve(self):
        key = (self.module, self.qualname, self.path, self.name)
        if key not in _RESOLVED:
            _RESOLVED[key] = load_function(self.path, self.name) if self.path else \
                _attr(self.module, self.qualname, self.module_file)
        return _RESOLVED[key]


_RESOLVED: dict[tuple, Any] = {}


def _attr(module: str, qualname: str, module_file: str | None = None):
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module or module_file is None:
            raise
        obj = import_file_as(Path(module_file), module)  # a custom_modules file, in a scoring process
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def load_function(path: str, name: str):
    """``name`` from the Python file ``path``, with errors that say which part is wrong."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise RewardError(f"reward.custom_reward_function.path {str(file)!r} does not exist")
    try:
        module = import_file(file, "rlvr_custom_reward")
    except Exception as err:
        raise RewardError(f"importing reward file {str(file)!r} failed: {type(err).__name__}: {err}") from err
    if not callable(getattr(module, name, None)):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise RewardError(
            f"reward file {str(file)!r} has no function {name!r} (reward.custom_reward_function.name); "
            f"it defines {found}"
        )
    return getattr(module, name)


TIMEOUT_SIGNAL = signal.SIGUSR2
"""The signal that stops a scoring call at ``reward.timeout_s``. Not SIGALRM: its timer is shared with
the code being timed, and ``signal.alarm(0)`` there (math-verify's own parsing timeout does it) would
clear the limit."""


class _Timeout(BaseException):
    """Raised by the timer's signal inside a scoring call (BaseException: user code's `except Exception` can't eat it)."""


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _TimeSpec), ("it_value", _TimeSpec)]


class _SigEvent(ctypes.Structure):  # Linux's struct sigevent (64 bytes), its thread id where SIGEV_THREAD_ID reads it
    _fields_ = [("sigev_value", ctypes.c_void_p), ("sigev_signo", ctypes.c_int), ("sigev_notify", ctypes.c_int),
                ("sigev_notify_thread_id", ctypes.c_int), ("_pad", ctypes.c_int * 11)]


class _KernelTimer:
    """A one-shot POSIX timer (``timer_create``, CLOCK_MONOTONIC) that sends ``TIMEOUT_SIGNAL`` to the thread
    that made it. The kernel sends it: it fires while a C call holds the GIL (a regex that backtracks
    for minutes checks for signals and stops), and nothing but this class can clear it."""

    signum = TIMEOUT_SIGNAL

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timer_create.argtypes = [ctypes.c_int, ctypes.POINTER(_SigEvent), ctypes.POINTER(ctypes.c_void_p)]
        libc.timer_settime.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_ITimerSpec),
                                       ctypes.POINTER(_ITimerSpec)]
        libc.timer_gettime.argtypes = [ctypes.c_void_p, ctypes.POINTER(_ITimerSpec)]
        self._libc, self._id, self.pid = libc, ctypes.c_void_p(), os.getpid()
        self._new, self._old = _ITimerSpec(), _ITimerSpec()  # reused: a sample's limit costs two calls
        event = _SigEvent(sigev_signo=TIMEOUT_SIGNAL, sigev_notify=4,  # SIGEV_THREAD_ID
                          sigev_notify_thread_id=threading.get_native_id())
        if libc.timer_create(1, ctypes.byref(event), ctypes.byref(self._id)) != 0:  # CLOCK_MONOTONIC
            raise OSError(ctypes.get_errno(), "timer_create failed")

    def _set(self, seconds: float) -> float:
        """Arm for ``seconds`` (0: disarm); the time that was left (0: it had fired)."""
        value, old = self._new.it_value, self._old.it_value
        value.tv_sec, value.tv_nsec = int(seconds), int((seconds - int(seconds)) * 1e9)
        self._libc.timer_settime(self._id, 0, self._new, self._old)
        return old.tv_sec + old.tv_nsec * 1e-9

    def arm(self, seconds: float) -> None:
        self._set(max(seconds, 1e-9))

    def disarm(self) -> bool:
        """Stop it; whether it had fired (its signal sent)."""
        return self._set(0) == 0

    def remaining(self) -> float:
        spec = _ITimerSpec()
        self._libc.timer_gettime(self._id, ctypes.byref(spec))
        return spec.it_value.tv_sec + spec.it_value.tv_nsec * 1e-9


class _AlarmTimer:
    """Where there is no ``timer_create`` (not Linux): SIGALRM's real-time timer, which the code being
    timed can clear (``signal.alarm(0)``)."""

    signum, pid = signal.SIGALRM, None

    def arm(self, seconds: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def disarm(self) -> bool:
        return signal.setitimer(signal.ITIMER_REAL, 0)[0] == 0

    def remaining(self) -> float:
        return signal.getitimer(signal.ITIMER_REAL)[0]


_TIMER: _KernelTimer | _AlarmTimer | None = None  # this process's, made by its main thread at its first limit
_ARMED = False  # a scoring call's limit is running: the timer's signal stops it


def _timer() -> _KernelTimer | _AlarmTimer:
    global _TIMER
    if _TIMER is None or (_TIMER.pid is not None and _TIMER.pid != os.getpid()):  # a forked child has no timers
        try:
            _TIMER = _KernelTimer()
        except (AttributeError, OSError):
            _TIMER = _AlarmTimer()
    return _TIMER


def _on_timeout(signum, frame):
    if _ARMED and _TIMER.remaining() == 0:  # a signal of an earlier call, armed again since, is ignored
        raise _Timeout()


def _time_limit(timeout_s: float | None):
    """Context: ``timeout_s`` seconds for the block (None: no limit), then ``_Timeout`` in it. Main thread only."""
    if timeout_s is None:
        return contextlib.nullcontext()
    return _limited(_timer(), timeout_s)


@contextlib.contextmanager
def _limited(timer, timeout_s: float):
    global _ARMED
    previous = signal.signal(timer.signum, _on_timeout)
    _ARMED, fired = True, True
    timer.arm(timeout_s)
    try:
        yield
    finally:
        try:
            fired = timer.disarm()  # the handler may still raise in here (the limit passed as the call returned)
        finally:
            _ARMED = False
            if fired:  # restored with the signal blocked and the one sent taken: never delivered to the old handler
                signal.pthread_sigmask(signal.SIG_BLOCK, {timer.signum})
                if timer.signum in signal.sigpending():
                    signal.sigwait({timer.signum})
            signal.signal(timer.signum, previous)
            if fired:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {timer.signum})


def as_score(value) -> tuple[float | None, str]:
    """A reward function's score as a float, or None and what it was instead: None, a string (even
    "0.75": a string is not a score), an int beyond float, NaN or inf."""
    if value is None or isinstance(value, (str, bytes)):
        return None, "None" if value is None else f"the string {value!r}, not a number"
    try:
        number = float(value)
    except OverflowError:
        return None, f"an int too large for a float ({str(value)[:12]}... with {len(str(value))} digits)"
    return (number, "") if math.isfinite(number) else (None, repr(number))


def score_sample(fns: tuple, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any,
                 timeout_s: float | None) -> dict:
    """Score one sample with weighted functions under a time limit (None: no limit; off the main thread,
    where the signal cannot act, none either: the manager scores there in a pool). Runs in a pool worker
    or inline; the working directory is put back after each call."""
    cwd = os.getcwd()
    limit = timeout_s if threading.current_thread() is threading.main_thread() else None
    try:
        with _time_limit(limit):
            return _score(fns, data_source, solution_str, ground_truth, extra_info)
    except _Timeout:  # also when it fires between the call's return and the disarm
        return {"status": "timeout", "error": f"took longer than reward.timeout_s={timeout_s} s"}
    finally:
        if os.getcwd() != cwd:  # os.chdir in a reward function would move the trainer's relative run paths
            os.chdir(cwd)


def _score(fns: tuple, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> dict:
    """The weighted sum of ``fns``' scores, each function called with verl's keyword arguments. A score
    that is not a number is invalid; an exception is an error."""
    total, extras, name = 0.0, {}, None
    try:
        for ref, weight in fns:
            name = ref.name
            result = ref.resolve()(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                                   extra_info=extra_info, **dict(ref.kwargs))
            if isinstance(result, dict):
                if "score" not in result:
                    raise RewardError(f"reward function {ref.name!r} returned a dict without 'score': {result}")
                value = result["score"]
                for key, extra in result.items():  # a key an earlier function returned too: under this one's name
                    if key != "score":
                        extras[f"{ref.name}/{key}" if key in extras else key] = extra
            else:
                value = result
            try:
                value, instead = as_score(value)
            except (TypeError, ValueError, RuntimeError) as err:  # a list, an array or tensor of several values
                raise TypeError(f"reward function {ref.name!r} returned {repr(value)[:200]} "
                                f"(a {type(value).__name__}), not a number ({err}); return one float, or a dict "
                                "with 'score'") from None
            if value is None:
                return {"status": "invalid", "error": f"reward function {ref.name!r} returned {instead}"}
            if len(fns) > 1:
                extras[ref.name] = value
            total += weight * value
    except SystemExit as err:  # sys.exit() in user code would end the run (or a pool worker) silently
        return {"status": "error", "error": f"reward function {name!r} called sys.exit({err.code!r})"}
    except Exception as err:  # reported with the sample by the manager, and counted
        return {"status": "error", "error": f"{type(err).__name__}: {err}"}
    if abs(total) > MAX_SCORE:
        return {"status": "invalid", "error": f"reward function {name!r} returned {total:.4g}, beyond "
                f"±{MAX_SCORE:.2g}: a group's std of such scores overflows float32 (rescale the reward)"}
    return {"status": "ok", "score": total, "extras": extras}


def given_score(value) -> dict:
    """An agent loop's ``reward_score`` as a scoring result: a finite number, else invalid (counted,
    its group left out, as a reward function's NaN)."""
    try:
        score, instead = as_score(value)
    except (TypeError, ValueError):
        score, instead = None, f"{value!r}, not a number"
    if score is None or abs(score) > MAX_SCORE:
        return {"status": "invalid", "error": f"the agent loop returned reward_score {instead or repr(score)}"}
    return {"status": "ok", "score": score, "extras": {}}


def score_chunk(jobs: list[tuple]) -> list[dict]:
    """``score_sample`` over a list of jobs (the unit of work sent to a pool worker)."""
    return [score_sample(*job) for job in jobs]


def resolve_all(refs: tuple) -> None:
    """Import each function's module or file now (a pool worker's start-up), not inside a sample's time
    limit, where a slow import would be cut off, undone, and tried again by every sample. A function
    that fails to resolve is left for the samples: each fails again, and is counted and reported with
    the error (an initializer that raised would only have the pool start the worker again)."""
    for ref in refs:
        try:
            ref.resolve()
        except (Exception, SystemExit):  # reported by every sample that uses it
            continue


def object_column(values: list) -> np.ndarray:
    """(n,) object array with one entry per row, whatever the entries are (np.array of n equal-length
    lists would make it (n, k))."""
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def refuse_reserved_extras(jobs: list[tuple], results: list[dict], columns) -> None:
    """An extra value named like a column the batch already has (``uid``: GRPO's groups, ``data_source``)
    would replace that column when the trainer adds the extras; ``score`` is the score's own name."""
    reserved = set(columns) | {"score"}
    for job, result in zip(jobs, results):
        clash = sorted(reserved.intersection(result.get("extras", ())))
        if not clash:
            continue
        key, names = clash[0], [ref.name for ref, _ in job[0]]
        owner = f"reward function {key!r}" if key in names else \
            f"reward function {names[0]!r}" if len(names) == 1 else f"one of the reward functions {names}"
        what = "the score's own name" if key == "score" else \
            f"a column of the batch (its columns: {sorted(columns)}), which the value would replace"
        raise RewardError(f"{owner} returned the extra value {key!r}, which is {what}; rename it")


@dataclass
class RewardResult:
    token_level_scores: torch.Tensor  # (bs, R): the score on each response's last valid token
    reward_extra_info: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    scores: torch.Tensor | None = None  # (bs,) the scorers' scores before overlong shaping
    invalid: torch.Tensor | None = None  # (bs,) bool: the scorer returned NaN, inf or None (a placeholder score)

    def select(self, rows) -> "RewardResult":
        """The results of ``rows`` (indices, repeats allowed), in that order; the metrics kept."""
        index = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        extra = {}
        for key, values in self.reward_extra_info.items():
            extra[key] = np.empty(len(index), dtype=object)
            for i, r in enumerate(index.tolist()):  # entries kept whole, lists included
                extra[key][i] = values[r]
        return RewardResult(self.token_level_scores[index.to(self.token_level_scores.device)], extra, dict(self.metrics),
                            None if self.scores is None else self.scores[index],
                            None if self.invalid is None else self.invalid[index])


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(bs,) scores -> (bs, R) with each score at its response's last valid token."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    # the last token the model generated: with tool output in the response, the mask has holes
    columns = torch.arange(response_mask.shape[-1], device=response_mask.device)
    last = torch.where(response_mask.bool(), columns, 0).amax(dim=-1).long() if response_mask.shape[-1] else \
        torch.zeros(len(scores), dtype=torch.long)
    out[torch.arange(len(scores), device=out.device), last] = scores.to(out)
    return out


# from a multi-turn rollout, for the scorer: the turns it added after the prompt, their count, the tool
# rewards, an interaction's score of each turn (verl's reward loop passes turn_scores in extra_info too)
TRAJECTORY_KEYS = ("messages", "num_turns", "tool_rewards", "turn_scores")


def with_trajectory_info(data: DataProto):
    """Each sample's ``extra_info``, plus (multi-turn) its conversation, turns and tool rewards."""
    extra_info = data.non_tensor_batch.get("extra_info")
    present = [k for k in TRAJECTORY_KEYS if k in data.non_tensor_batch]
    if not present:
        return extra_info
    out = []
    for i in range(len(data)):
        info = dict(extra_info[i] or {}) if extra_info is not None else {}
        info.update({k: data.non_tensor_batch[k][i] for k in present})
        out.append(info)
    return out


class RewardManager:
    """Computes rule-based scores for a batch of responses (see the module docstring)."""

    def __init__(self, tokenizer, config: RewardConfig | None = None, reward_fn_key: str = "data_source",
                 max_response_length: int | None = None):
        self.tokenizer, self.config = tokenizer, config or RewardConfig()
        self.reward_fn_key = reward_fn_key
        self.max_response_length = max_response_length
        if self.config.overlong_buffer.enable and max_response_length is None:
            raise RewardError("reward.overlong_buffer needs the reward manager to know data.max_response_length")
        self._fixed_fns = self._configured_functions()
        self._pool = None
        self._async = None

    def _configured_functions(self) -> tuple | None:
        """The functions every sample uses, or None to choose by data_source."""
        custom = self.config.custom_reward_function
        if custom.path:
            load_function(custom.path, custom.name)  # fail now, at start-up, if path or name is wrong
            ref = FnRef(custom.name, path=str(Path(custom.path).expanduser()), kwargs=tuple(custom.reward_kwargs.items()))
            return ((ref, 1.0),)
        if self.config.functions:
            return tuple((FnRef.of(f.name, REWARD_FNS.get(f.name)), f.weight) for f in self.config.functions)
        return None

    def _functions_for(self, data_source: str) -> tuple:
        if self._fixed_fns is not None:
            return self._fixed_fns
        name = reward_fn_name_for(data_source)
        return ((FnRef.of(name, REWARD_FNS.get(name)), 1.0),)

    # ------------------------------------------------------------------ scoring
    def __call__(self, data: DataProto) -> RewardResult:
        return self.compute(data)

    def compute(self, data: DataProto) -> RewardResult:
        data.require("responses", "response_mask", self.reward_fn_key, stage="reward")
        responses, mask = data.batch["responses"], data.batch["response_mask"]
        # the whole response, as verl scores it: with tools, the calls and their results included
        present = data.batch["attention_mask"][:, -responses.shape[1]:] if "attention_mask" in data.batch else mask
        texts = [self.tokenizer.decode(r[m.bool()], skip_special_tokens=True) for r, m in zip(responses.cpu(), present.cpu())]
        sources = data.non_tensor_batch[self.reward_fn_key]
        reward_model = data.non_tensor_batch.get("reward_model")
        extra_info = with_trajectory_info(data)
        given = data.non_tensor_batch.get("reward_score")  # an agent loop's own score of its row (None: none)
        jobs = []
        for i, text in enumerate(texts):
            if given is not None and given[i] is not None:
                continue
            truth = None if reward_model is None or reward_model[i] is None else reward_model[i].get("ground_truth")
            jobs.append((self._functions_for(sources[i]), sources[i], text, truth,
                         None if extra_info is None else extra_info[i], self.config.timeout_s))
        start = time.perf_counter()
        results = self._run(jobs)
        refuse_reserved_extras(jobs, results, data.non_tensor_batch)
        if given is not None:  # the loops' scores in their rows' places, checked as a function's are
            scored = iter(results)
            results = [next(scored) if value is None else given_score(value) for value in given]
        result = self._collect(results, texts, sources, mask, time.perf_counter() - start)
        if self.config.overlong_buffer.enable:
            self._shape_overlong(result, mask, present.sum(dim=-1).cpu())
        return result

    def _shape_overlong(self, result: RewardResult, mask: torch.Tensor, lengths: torch.Tensor) -> None:
        """DAPO: add the overlong penalty of each response's length (the budget's tokens, tool
        output included) to its score."""
        buffer = self.config.overlong_buffer
        penalty = overlong_penalty(lengths, self.max_response_length, buffer.len, buffer.penalty_factor)
        result.token_level_scores = place_on_last_token(result.scores + penalty, mask)
        result.reward_extra_info["overlong_reward"] = penalty.numpy().astype(object)
        result.metrics["reward/overlong_penalty/mean"] = float(penalty.mean())
        result.metrics["reward/overlong_ratio"] = float((penalty < 0).float().mean())

    def _run(self, jobs: list[tuple]) -> list[dict]:
        """Score ``jobs`` inline, or in the pool in chunks (one message per chunk, not per sample).

        Each sample has its own timer inside the worker; the chunk deadline is only a backstop
        for a worker that stops answering (stuck in C code): its chunk is counted as timeouts
        and the pool is rebuilt, the other chunks keep their scores.
        """
        workers = self._pool_size()
        if workers == 0:
            return [score_sample(*job) for job in jobs]
        pool = self._get_pool()
        size = max(1, -(-len(jobs) // (workers * 8)))  # ~8 chunks per worker balance the load
        chunks = [jobs[i:i + size] for i in range(0, len(jobs), size)]
        pending = [pool.apply_async(score_chunk, (chunk,)) for chunk in chunks]
        waves = -(-len(jobs) // workers)  # ceil: samples per worker
        limit = self.config.timeout_s
        deadline = None if limit is None else time.monotonic() + limit * waves + POOL_GRACE_S
        results = []
        for chunk, item in zip(chunks, pending):
            try:
                results.extend(item.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic())))
            except multiprocessing.TimeoutError:
                results.extend({"status": "timeout", "error": "the scoring worker stopped answering; it was killed"}
                               for _ in chunk)
                self._kill_pool()
        return results

    def _collect(self, results, texts, sources, mask, elapsed) -> RewardResult:
        scores = torch.zeros(len(results))
        extras: dict[str, list] = {}
        counts = {"error": 0, "timeout": 0}
        invalid = torch.zeros(len(results), dtype=torch.bool)
        invalid_by_source: dict[str, int] = {}
        first_failure = first_invalid = None
        for i, res in enumerate(results):
            if res["status"] == "invalid":  # NaN, inf or None: no score at all, never a number with an advantage
                if self.config.on_invalid == "raise":
                    raise RewardError(f"reward for sample {i} (data_source={sources[i]!r}, response={texts[i][:200]!r}) "
                                      f"is not a number: {res['error']}; set reward.on_invalid=drop to drop its group "
                                      "from the update instead")
                invalid[i] = True
                invalid_by_source[str(sources[i])] = invalid_by_source.get(str(sources[i]), 0) + 1
                first_invalid = first_invalid or f"sample {i} (data_source={sources[i]!r}): {res['error']}"
                scores[i] = self.config.failure_score  # a placeholder the update never sees: the group is dropped
                continue
            if res["status"] != "ok":
                counts[res["status"]] += 1
                message = (f"reward for sample {i} (data_source={sources[i]!r}, response={texts[i][:200]!r}) "
                           f"failed: {res['error']}")
                if self.config.on_error == "raise":
                    raise RewardError(message + "; set reward.on_error=score to give failures reward.failure_score")
                first_failure = first_failure or message
                scores[i] = self.config.failure_score
                continue
            scores[i] = res["score"]
            for key, value in res["extras"].items():
                extras.setdefault(key, [None] * len(results))[i] = value
        failed = counts["error"] + counts["timeout"]
        if results and failed / len(results) > self.config.max_failed_fraction:
            raise RewardError(f"{failed} of {len(results)} samples failed to score (more than "
                              f"reward.max_failed_fraction={self.config.max_failed_fraction}); the first: "
                              f"{first_failure}. Fix the reward function or the data (a missing "
                              "reward_model.ground_truth?), or raise reward.max_failed_fraction")
        if first_failure:
            print(f"[rlvr] {first_failure} ({counts['error']} errors, {counts['timeout']} timeouts this step; "
                  f"they score reward.failure_score={self.config.failure_score})", file=sys.stderr, flush=True)
        metrics = {"reward/num_errors": float(counts["error"]), "reward/num_timeouts": float(counts["timeout"]),
                   "reward/num_invalid": float(invalid.sum()), "timing_s/reward_fn": elapsed}
        for source, count in invalid_by_source.items():
            metrics[f"reward/num_invalid/{source}"] = float(count)
        if first_invalid:
            print(f"[rlvr] {int(invalid.sum())} reward(s) of this batch are not numbers (first: {first_invalid}): "
                  "counted, and never trained on (reward.on_invalid=drop leaves their groups out of the update)",
                  file=sys.stderr, flush=True)
        for key, values in extras.items():
            numeric = [float(v) for v in values if isinstance(v, (int, float, bool, np.number, np.bool_))]
            if numeric:
                metrics[f"reward/{key}/mean"] = float(np.mean(numeric))
        return RewardResult(place_on_last_token(scores, mask), {k: object_column(v) for k, v in extras.items()},
                            metrics, scores, invalid)

    # ------------------------------------------------------------------ pool and async
    def _pool_size(self) -> int:
        """Scoring processes for this call: ``num_workers``; 0 scores inline, unless this is not the
        main thread and a time limit is set: the timer cannot act here, so one process scores."""
        if self.config.num_workers > 0:
            return self.config.num_workers
        off_main = threading.current_thread() is not threading.main_thread()
        return 1 if off_main and self.config.timeout_s is not None else 0

    def _get_pool(self):
        """The worker pool, started and warmed up (every worker has imported the scoring code):
        the start-up time must not count against a batch's deadline."""
        if self._pool is None:
            workers = max(1, self.config.num_workers)
            context = multiprocessing.get_context("forkserver")  # safe beside torch's threads
            self._pool = context.Pool(workers, initializer=resolve_all, initargs=(self._known_functions(),))
            self._pool.map(score_chunk, [[]] * workers, chunksize=1)
        return self._pool

    def _known_functions(self) -> tuple:
        """The functions a sample may use: the configured ones, else every registered one."""
        if self._fixed_fns is not None:
            return tuple(ref for ref, _ in self._fixed_fns)
        return tuple(FnRef.of(name, REWARD_FNS.get(name)) for name in REWARD_FNS.names())

    def _kill_pool(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def submit(self, data: DataProto) -> concurrent.futures.Future:
        """Score in the background (``reward.launch_reward_fn_async``); ``.result()`` gives the RewardResult."""
        if self._async is None:
            self._async = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlvr-reward")
            if self.config.num_workers <= 0:  # the timer needs the main thread: score in one worker process
                self.config = dataclasses.replace(self.config, num_workers=1)
        return self._async.submit(self.compute, data)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None
        if self._async is not None:
            self._async.shutdown(wait=True)
            self._async = None

    def __del__(self):
        try:
            self._kill_pool()
        except Exception:  # interpreter shutdown: the pool may already be gone
            pass
