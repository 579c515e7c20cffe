"""The engine core on a thread of its own, for callers on an asyncio event loop (``rlvr serve``).

``await engine.generate(request)`` submits a request and returns its completion; cancelling the
awaiting task (a client that disconnected, a timeout) aborts the request and frees its row.
Every touch of the core (adding, aborting, pausing, loading weights) runs on the engine thread
between two steps, so the core never sees two threads: callers post a command and await its
result. ``pause``/``update_weights``/``resume`` follow the core's policies (``core.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from rlvr.rollout.base import Completion
from rlvr.rollout.core import EngineCore, Request


class EngineBusy(RuntimeError):
    """The waiting queue is full (the server answers 503 with Retry-After)."""


class AsyncEngine:
    """``core`` driven by a daemon thread: ``start()``, then the coroutines below, then ``stop()``."""

    def __init__(self, core: EngineCore, max_waiting: int = 4096, step_context: Callable[[], Any] | None = None):
        self.core = core
        self.max_waiting = max_waiting
        self.step_context = step_context or contextlib.nullcontext
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="rlvr-engine", daemon=True)
        self.error: BaseException | None = None
        self.closed = False  # the thread runs no more commands
        self._outbox: list[tuple[asyncio.AbstractEventLoop, Callable, tuple]] = []  # the engine thread's, per step
        core.on_sampled = self._deliver  # tokens reach their streams before the step's decode runs

    def start(self) -> None:
        self.thread.start()

    def stop(self, abort: bool = True, timeout: float = 30.0) -> None:
        """End the thread: running and waiting requests are aborted (``abort``) or finished first."""
        if abort:
            self._post_nowait(lambda: self.core.abort_all())
        self._post_nowait(self._set_stopping)
        self.thread.join(timeout)

    def _set_stopping(self) -> None:
        self.stopping = True

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    # ------------------------------------------------------------------ commands
    def _post_nowait(self, fn: Callable[[], Any]) -> None:
        self.commands.put((fn, None, None))
        self.wake.set()

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` on the engine thread between two steps -> its result (or its exception)."""
        if not self.alive:
            raise RuntimeError(f"the engine thread has stopped: {self.error!r}")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.commands.put((fn, loop, future))
        self.wake.set()
        if self.closed:  # the thread ended between the check and the put: nobody will run it
            self._fail_pending()
        return await future

    async def generate(self, request: Request, on_tokens: Callable[[list[int], list[float]], None] | None = None) -> Completion:
        """Submit ``request`` -> its completion. ``on_tokens`` (streaming) is called on the caller's
        loop with each new token. Cancelled: the request is aborted."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finished(completion: Completion) -> None:
            self._outbox.append((loop, _finish, (done, completion)))

        def tokens(ids: list[int], log_probs: list[float]) -> None:
            self._outbox.append((loop, on_tokens, (ids, log_probs)))

        request = replace(request, on_finish=finished, on_tokens=tokens if on_tokens is not None else None)

        def add() -> None:
            if len(self.core.waiting) >= self.max_waiting:
                raise EngineBusy(f"{len(self.core.waiting)} requests are waiting (at most {self.max_waiting})")
            self.core.add(request)

        try:
            await self.call(add)
            return await asyncio.shield(done)
        except asyncio.CancelledError:  # posted after the add, if the add is still queued: it runs first
            self._post_nowait(lambda: self.core.abort(request.id))
            raise

    async def abort(self, request_id: str | None = None) -> int:
        """Abort one request (or all with None) -> how many ended."""
        if request_id is None:
            return await self.call(self.core.abort_all)
        return int(await self.call(lambda: self.core.abort(request_id)))

    async def pause(self, mode: str = "wait", deadline_s: float = 600.0) -> None:
        """Stop admitting; ``"wait"`` returns once the running rows have finished."""
        await self.call(lambda: self.core.pause(mode))
        if mode == "wait":
            loop = asyncio.get_running_loop()
            end = loop.time() + deadline_s
            while await self.call(lambda: bool(self.core.running)):
                if loop.time() > end:
                    raise TimeoutError(f"pause: rows still running after {deadline_s:.0f} s")
                await asyncio.sleep(0.01)

    async def update_weights(self, load: Callable[[], None], version: int) -> None:
        """``load()`` on the engine thread (the core must be paused or idle), then name ``version``."""

        def update() -> None:
            if self.core.running and self.core.stepping:
                raise RuntimeError("update_weights: rows are running; pause the engine first")
            with torch.inference_mode(False), torch.no_grad():
                load()
            self.core.set_weight_version(version)

        await self.call(update)

    async def resume(self) -> None:
        await self.call(self.core.resume)

    # ------------------------------------------------------------------ the thread
    def _run_commands(self) -> None:
        while True:
            try:
                fn, loop, future = self.commands.get_nowait()
            except queue.Empty:
                return
            try:
                result, error = fn(), None
            except BaseException as err:  # handed to the caller that posted it
                result, error = None, err
            if loop is not None:
                loop.call_soon_threadsafe(settle, future, result, error)

    def _fail_pending(self) -> None:
        """Answer every command still queued with the reason the thread ended: a caller awaiting
        one (a pause, a flush, an abort) hears it instead of waiting forever."""
        error = RuntimeError(f"the engine thread has stopped: {self.error!r}" if self.error is not None
                             else "the engine thread has stopped")
        while True:
            try:
                _, loop, future = self.commands.get_nowait()
            except queue.Empty:
                return
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: nobody waits
                    loop.call_soon_threadsafe(settle, future, None, error)

    def _deliver(self) -> None:
        """Hand a step's tokens and completions to their loops: one wake-up per loop and step,
        not one per row and token (32 streams at once made that the server's main cost)."""
        if not self._outbox:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for loop, fn, args in self._outbox:
            by_loop.setdefault(loop, []).append((fn, args))
        self._outbox = []
        for loop, calls in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(_run_all, calls)

    def _loop(self) -> None:
        try:
            while not self.stopping:
                self._run_commands()
                self._deliver()
                if self.stopping:
                    break
                if self.core.has_work():
                    with self.step_context():
                        self.core.step()  # hands its tokens over itself (core.on_sampled)
                    continue
                self.wake.wait(0.05)
                self.wake.clear()
        except BaseException as err:  # the engine failed: every waiting caller hears it
            self.error = err
            with contextlib.suppress(Exception):
                self.core.abort_all()
                self._deliver()
            raise
        finally:
            self.closed = True  # before the drain: a command put after it is drained by its caller
            self._fail_pending()


def _finish(done: asyncio.Future, completion: Completion) -> None:
    if not done.done():
        done.set_result(completion)


def _run_all(calls: list[tuple[Callable, tuple]]) -> None:
    """On the caller's loop: each call alone, as separate callbacks would run (one failing stream
    is reported by the loop and does not stop the others)."""
    for fn, args in calls:
        try:
            fn(*args)
        except Exception as err:
            asyncio.get_running_loop().call_exception_handler({"message": "a stream callback failed",
                                                               "exception": err})


def settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Give ``future`` its result or error, unless it is already done (cancelled by its caller)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
