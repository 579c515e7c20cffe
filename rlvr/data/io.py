"""Read and write dataset rows (parquet or JSONL) with errors that name the file and row."""

from __future__ import annotations

import codecs
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
    return [row for _, row in read_numbered_rows(path)]


def read_numbered_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """All rows of a parquet or JSONL file, each with where it is: ``row i`` (parquet, from 0),
    ``line n`` (JSONL, as an editor counts: blank lines too, from 1) or ``item i`` (a .json file
    holding one array, from 0), for messages about it."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise DatasetError(_folder_message(path))
    if not path.is_file():
        hint = ""
        if "arithmetic" in str(path) or "countdown" in str(path):
            hint = f"; create it with `rlvr prepare {'arithmetic' if 'arithmetic' in str(path) else 'countdown'}`"
        raise DatasetError(f"dataset file {str(path)!r} does not exist{hint}")
    if path.suffix == ".parquet":
        try:
            return [(f"row {i}", row) for i, row in enumerate(pq.read_table(path).to_pylist())]
        except (pa.ArrowInvalid, OSError) as err:
            raise DatasetError(f"dataset file {str(path)!r} is not a readable parquet file: {err}") from None
    if path.suffix == ".json" and _holds_array(path):  # verl reads .json with datasets' loader: an array too
        return _read_json_array(path)
    if path.suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    raise DatasetError(f"dataset file {str(path)!r} has suffix {path.suffix!r}; rlvr reads {list(SUFFIXES)}")


def _folder_message(path: Path) -> str:
    """A folder given as a dataset file: name the data files in it (a download's shards), all of them."""
    found = sorted(str(p) for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not found:
        return f"dataset path {str(path)!r} is a folder; give the file itself ({', '.join(SUFFIXES)})"
    shown = found if len(found) <= 20 else [*found[:20], f"... {len(found) - 20} more"]
    return (f"dataset path {str(path)!r} is a folder of {len(found)} dataset files; list them all: "
            f"data.train_files={shown} (or data.val_files; only the files of that split)")


def _read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    with path.open("rb") as fh:  # decoded line by line: an encoding error names its line
        for line_no, raw in enumerate(fh, start=1):
            line = _decode_line(path, line_no, raw)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                whole = ""
                if line_no == 1 and line.strip() in ("{", "["):  # a pretty-printed .json file
                    whole = "; rlvr reads JSON Lines: one whole JSON object per line"
                raise DatasetError(f"{path}: line {line_no} is not valid JSON ({err.msg}){whole}") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}: line {line_no} is a JSON {type(row).__name__}, not an object")
            rows.append((f"line {line_no}", row))
    return rows


def _holds_array(path: Path) -> bool:
    """Whether the file's first character (after a byte-order mark and whitespace) opens a JSON array."""
    with path.open("rb") as fh:
        return fh.read(1 << 16).removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"[")


def _read_json_array(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """A .json file holding one JSON array of row objects; rows are named ``item i`` (from 0)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line_no = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise DatasetError(_not_utf8(path, line_no, raw[err.start], column)) from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise DatasetError(f"{path}: line {err.lineno} is not valid JSON ({err.msg}, column {err.colno})") from None
    rows = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise DatasetError(f"{path}: item {i} of the array (from 0) is a JSON {type(item).__name__}, not an object")
        rows.append((f"item {i}", item))
    return rows


def _not_utf8(path: Path, line_no: int, byte: int, column: int) -> str:
    return (f"{path}: line {line_no} is not UTF-8 (byte {byte:#04x} at column {column}); JSON is read as "
            f"utf-8: convert the file, e.g. iconv -f latin1 -t utf-8 {path} > {path.stem}.utf8{path.suffix} "
            "(if it is latin-1)")


def _decode_line(path: Path, line_no: int, raw: bytes) -> str:
    """One line as UTF-8 (JSONL's encoding; a byte-order mark on the first line is dropped)."""
    try:
        return raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
    except UnicodeDecodeError as err:
        raise DatasetError(_not_utf8(path, line_no, raw[err.start], err.start + 1)) from None


def write_parquet(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write rows to ``path`` atomically (temporary file, then rename)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
    tmp.replace(path)
    return path
