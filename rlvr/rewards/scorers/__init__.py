"""Built-in scorers. Each has the signature
``score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``."""
