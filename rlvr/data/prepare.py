"""``rlvr prepare TASK``: write ``train.parquet`` and ``test.parquet`` in verl's row format."""

from __future__ import annotations

from pathlib import Path

from rlvr.data.io import write_parquet
from rlvr.data.tasks import arithmetic, calculator, countdown, gsm8k

DEFAULT_ROOT = Path("~/data")


def prepare_arithmetic(out_dir: Path, train_size: int = 1000, test_size: int = 300, seed: int = 0,
                       spec: arithmetic.ArithmeticSpec = arithmetic.ArithmeticSpec()) -> dict[str, Path]:
    splits = arithmetic.make_splits(train_size, test_size, seed, spec)
    return {split: write_parquet(rows, out_dir / f"{split}.parquet") for split, rows in splits.items()}


def prepare_countdown(out_dir: Path, train_size: int = 10000, test_size: int = 300, seed: int = 0,
                      min_count: int = 3, max_count: int = 4) -> dict[str, Path]:
    seen: set = set()  # the test problems first, then train without them: the splits are disjoint
    sizes = {"test": test_size, "train": train_size}
    rows = {split: countdown.make_rows(n, seed, split, seen=seen, min_count=min_count, max_count=max_count)
            for split, n in sizes.items()}
    return {split: write_parquet(rows[split], out_dir / f"{split}.parquet") for split in ("train", "test")}


def prepare_gsm8k(out_dir: Path, src: Path, system_prompt: str | None = None) -> dict[str, Path]:
    """GSM8K's raw files as verl rows; ``system_prompt`` (a text, or a name in gsm8k.SYSTEM_PROMPTS)
    puts the answer format in a system message, as seed 002's trainer does."""
    return {split: write_parquet(rows, out_dir / f"{split}.parquet")
            for split, rows in gsm8k.convert(src, system_prompt).items()}


def prepare_calculator(out_dir: Path, train_size: int = 1000, test_size: int = 100, seed: int = 0,
                       with_tool: bool = True) -> dict[str, Path]:
    """The tool task (``a * b + c``, 3x2-digit products); ``with_tool=False``: the same problems, no tool."""
    return {split: write_parquet(rows, out_dir / f"{split}.parquet")
            for split, rows in calculator.make_splits(train_size, test_size, seed, with_tool).items()}
