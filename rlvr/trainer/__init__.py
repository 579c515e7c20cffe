"""The fit loop, validation, checkpoints, metrics and tracking (``rlvr train``)."""


class TrainingInterrupted(Exception):
    """Ctrl-C during training; the message says what was saved."""
