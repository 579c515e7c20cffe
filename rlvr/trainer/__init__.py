"""The fit loop, validation, checkpoints, metrics and tracking (``rlvr train``)."""


class TrainingInterrupted(Exception):
    """Ctrl-C during training; the message says what was saved."""


class StopTraining(RuntimeError):
    """The run cannot go on (every reward failing, NaN updates in a row, dynamic sampling finding
    no signal); the message says why and what to change. The last checkpoint stays loadable."""
