"""Read and write dataset rows (parquet or JSONL) with errors that name the file and row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

SUFFIXES = (".parquet", ".jsonl", ".json")


class DatasetError(ValueError):
    """A dataset file or row that cannot be used; the message names the file, row and key."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a parquet or JSONL file as dicts."""
    path = Path(path).expanduser()
    if not path.is_file():
        hint = ""
        if "arithmetic" in str(path) or "countdown" in str(path):
            hint = f"; create it with `rlvr prepare {'arithmetic' if 'arithmetic' in str(path) else 'countdown'}`"
        raise DatasetError(f"dataset file {str(path)!r} does not exist{hint}")
    if path.suffix == ".parquet":
        try:
            return pq.read_table(path).to_pylist()
        except (pa.ArrowInvalid, OSError) as err:
            raise DatasetError(f"dataset file {str(path)!r} is not a readable parquet file: {err}") from None
    if path.suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    raise DatasetError(f"dataset file {str(path)!r} has suffix {path.suffix!r}; rlvr reads {list(SUFFIXES)}")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{path}: line {line_no} is not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}: line {line_no} is a JSON {type(row).__name__}, not an object")
            rows.append(row)
    return rows


def write_parquet(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write rows to ``path`` atomically (temporary file, then rename)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
    tmp.replace(path)
    return path
