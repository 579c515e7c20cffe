"""What the training step is doing now, and for how long: its phase (generating 12/48 rows,
scoring, old log-probs, updating mini-batch 2/4, saving) with the phase's elapsed time.

The trainer's stages run inside ``StepProgress.stage`` (which also times them, as
``metrics.timer`` does), so the step still reads as its stages; the rollout engine and the actor
count their rows and mini-batches through ``rlvr.progress``, which this object listens to.

On a terminal the phase is the bar's description, redrawn every ``TICK_S`` so its clock moves.
Where stdout is not a terminal (``nohup``, a job log), it is plain lines at a bounded rate: a
step that runs past ``QUIET_S`` prints its phase, then each phase change, and a phase that runs
on prints again every ``EVERY_S`` with its counts; never a line per token, and a step shorter
than ``QUIET_S`` prints only its step line. verl and TRL print nothing between their step lines.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator

from tqdm import tqdm

from rlvr.progress import listening
from rlvr.trainer.metrics import timer

QUIET_S = 5.0  # a step that ends sooner prints no phase lines in a log
EVERY_S = 15.0  # a phase that runs on prints a line this often in a log
TICK_S = 1.0  # how often the bar's clocks are redrawn and a log's due line is printed

# stage (its timer's name) -> (what the user reads, the unit it counts through rlvr.progress, or None)
PHASES = {
    "freshness_probe": ("checking the engine's weights", None),
    "gen": ("generating", "rows"),
    "gen_max": ("generating greedy baselines", "rows"),
    "wait_gen": ("waiting for the rollout ahead", None),
    "reward_model": ("scoring with the reward model", None),
    "reward": ("scoring", None),
    "old_log_prob": ("old log-probs", None),
    "ref": ("ref log-probs", None),
    "values": ("critic values", None),
    "adv": ("advantages", None),
    "dump_rollout": ("writing rollouts", None),
    "update_critic": ("updating the critic", "mini-batch"),
    "update_actor": ("updating", "mini-batch"),
    "sync_weights": ("syncing weights", None),
    "testing": ("validating", None),
    "saving": ("saving", None),
}


class StepProgress:
    """The phase of the step under way, shown on ``bar`` (a tqdm bar, or None) and, where
    ``plain`` (default: stdout is not a terminal), written as lines through ``write``. The bar is
    redrawn every tick where ``live_bar`` (default: the bar writes to a terminal)."""

    def __init__(self, bar: tqdm | None = None, plain: bool | None = None, write: Callable[[str], None] = tqdm.write,
                 clock: Callable[[], float] = time.monotonic, live_bar: bool | None = None):
        self.bar = bar if bar is not None and not bar.disable else None
        self.plain = (not sys.stdout.isatty()) if plain is None else plain
        self._write, self._clock = write, clock
        self._desc = bar.desc if self.bar is not None else ""
        # a bar written to a file (nohup, a job log) is not redrawn every tick: one line a second
        # would fill the log; it shows the phase at its own next update
        self._live_bar = self.bar is not None and (_is_terminal(getattr(self.bar, "fp", None)) if live_bar is None
                                                   else live_bar)
        self._step: int | None = None
        self._label, self._unit, self._counts = "", None, None
        self._step_start = self._phase_start = self._printed = 0.0
        self._announced = False  # this step's phase lines have begun (it ran past QUIET_S)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ what the trainer calls
    def start_step(self, step: int) -> None:
        with self._lock:
            self._step, self._announced = step, False
            self._step_start = self._clock()
        self._ensure_ticking()

    @contextlib.contextmanager
    def stage(self, name: str, timings: dict[str, float]) -> Iterator[None]:
        """Time the stage ``name`` into ``timings`` (as ``metrics.timer``) and show it as the phase."""
        self.phase(name)
        with timer(name, timings), listening(self._count):
            yield

    def phase(self, name: str) -> None:
        """The step's work is now the stage ``name`` (a key of ``PHASES``, or a label)."""
        with self._lock:
            self._label, self._unit = PHASES.get(name, (name, None))
            self._counts, self._phase_start = None, self._clock()
            if self._step is not None and self.plain and (self._announced or self._running() >= QUIET_S):
                self._print()
        self._redraw()

    def end_step(self) -> None:
        with self._lock:
            self._step = None
        if self.bar is not None:
            self.bar.set_description_str(self._desc, refresh=False)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # ------------------------------------------------------------------ inside
    def describe(self) -> str:
        """``step 3: generating 12/48 rows (8 s; step 20 s)``"""
        now = self._clock()
        what = self._label
        if self._counts is not None:
            done, total = self._counts
            what += f" {done}/{total} rows" if self._unit == "rows" else f" {self._unit} {done}/{total}"
        return f"step {self._step}: {what} ({now - self._phase_start:.0f} s; step {now - self._step_start:.0f} s)"

    def _count(self, unit: str, done: int, total: int) -> None:
        """From ``rlvr.progress``: counts of this phase's unit only (async: the engine's thread
        generating ahead reports its rows while the step does something else)."""
        if unit == self._unit:
            self._counts = (done, total)

    def _running(self) -> float:
        return self._clock() - self._step_start

    def _print(self) -> None:
        self._announced, self._printed = True, self._clock()
        self._write(f"[rlvr] {self.describe()}")

    def _redraw(self) -> None:
        if self.bar is not None and self._step is not None:
            self.bar.set_description_str(f"{self._desc} · {self.describe()}", refresh=False)
            if self._live_bar:
                self.bar.refresh()

    def _tick(self) -> None:
        """Every TICK_S: the bar's clocks move; a log gets the step's first line once it runs past
        QUIET_S, and a line every EVERY_S of one phase."""
        with self._lock:
            if self._step is None:
                return
            if self.plain and not self._announced and self._running() >= QUIET_S:
                self._print()
            elif self.plain and self._announced and self._clock() - self._printed >= EVERY_S:
                self._print()
        self._redraw()

    def _ensure_ticking(self) -> None:
        if self._thread is not None or (not self._live_bar and not self.plain):
            return

        def run() -> None:
            while not self._stop.wait(TICK_S):
                self._tick()
        self._thread = threading.Thread(target=run, name="rlvr-step-progress", daemon=True)
        self._thread.start()


def _is_terminal(stream) -> bool:
    """tqdm wraps its file; the wrapped stream says whether it is a terminal."""
    stream = getattr(stream, "stream", stream)
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
