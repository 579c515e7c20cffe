"""Progress within a stage's work (rows generated, mini-batches updated), for whoever shows it.

The stages below the trainer cannot import it (tests/test_layering.py), so they report here, to
the one listener the trainer or ``rlvr eval`` installs around the work (``listening``); with none
(a Ray worker's process, a library user) a report costs a function call and goes nowhere. The
listener only records the counts: drawing them is its business, at its own rate, never per token.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

Listener = Callable[[str, int, int], None]  # (what is counted, done, total)
_listener: Listener | None = None


def advance(unit: str, done: int, total: int) -> None:
    """``done`` of ``total`` ``unit`` (e.g. "rows") of the work under way are finished."""
    if _listener is not None:
        _listener(unit, done, total)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Send the reports made inside the block to ``listener`` (the previous one comes back after)."""
    global _listener
    previous, _listener = _listener, listener
    try:
        yield
    finally:
        _listener = previous
