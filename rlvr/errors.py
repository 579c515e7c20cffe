"""Errors that end a run with a message for the user, shared by every layer.

They live here, below the stages, so that ``workers/``, ``rewards/`` and ``distributed/`` can
raise them without importing the trainer that catches them.
"""


class StopTraining(RuntimeError):
    """The run cannot go on (every reward failing, NaN updates in a row, dynamic sampling finding
    no signal, a worker failing); the message says why and what to change. The last checkpoint
    stays loadable."""


class TrainingInterrupted(Exception):
    """Ctrl-C during training; the message says what was saved."""


class RolloutUnavailable(StopTraining):
    """The rollout cannot generate any more (every rollout server down): the trainer saves the
    last complete step, as on Ctrl-C, and stops with the reason."""
