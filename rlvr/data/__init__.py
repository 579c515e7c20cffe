"""Datasets: reading rows, the RLHF prompt dataset, the resumable sampler, task data."""

from rlvr.data.dataset import RLHFDataset, collate, left_pad, truncate_ids, validate_row
from rlvr.data.io import DatasetError, read_rows, write_parquet
from rlvr.data.sampler import PromptLoader, ResumableSampler

__all__ = ["DatasetError", "PromptLoader", "RLHFDataset", "ResumableSampler", "collate", "left_pad",
           "read_rows", "truncate_ids", "validate_row", "write_parquet"]
