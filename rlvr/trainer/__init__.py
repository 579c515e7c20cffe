"""The fit loop, validation, checkpoints, metrics and tracking (``rlvr train``)."""
