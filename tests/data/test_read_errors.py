"""A JSONL file that is not UTF-8 is one message naming the file, the line and the byte, with
the fix; it was a UnicodeDecodeError traceback (issue 47, §2)."""

import pytest

from rlvr.data.io import DatasetError, read_rows


def test_a_latin1_jsonl_names_the_file_line_and_byte(tmp_path):
    path = tmp_path / "rows.jsonl"
    # line 2 holds "café" in latin-1: é is the single byte 0xe9, never valid UTF-8 before a quote;
    # its column: {"prompt": "caf is 1 + 8 + 1 + 1 + 1 + 3 = 15 characters, so é is the 16th
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match=rf"{path}: line 2 is not UTF-8 \(byte 0xe9 at column 16\).*utf-8.*iconv"):
        read_rows(path)


def test_a_utf8_file_with_a_byte_order_mark_reads(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes('\ufeff{"prompt": "café"}\n'.encode("utf-8"))
    assert read_rows(path) == [{"prompt": "café"}]


def test_a_json_file_holding_an_array_of_rows_reads(tmp_path):
    """verl reads a .json data file with datasets' json loader, which takes a JSON array of rows as
    well as JSON Lines; rlvr refused the array ("line 1 is a JSON list, not an object")."""
    import json

    rows = [{"data_source": "a", "prompt": [{"role": "user", "content": "1 + 2?"}]}, {"data_source": "b", "x": 2}]
    one_line, pretty = tmp_path / "one.json", tmp_path / "pretty.json"
    one_line.write_text(json.dumps(rows))
    pretty.write_bytes(("\ufeff" + json.dumps(rows, indent=2)).encode("utf-8"))
    assert read_rows(one_line) == rows and read_rows(pretty) == rows
    # a broken array names its line (the missing comma is on line 4); an item that is no object, its item
    (tmp_path / "broken.json").write_text('[\n  {"a": 1},\n  {"a": 2}\n  {"a": 3}\n]\n')
    # line 4 is '  {"a": 3}': the object that should follow a comma opens at column 3
    with pytest.raises(DatasetError,
                       match=r"broken.json: line 4 is not valid JSON \(Expecting ',' delimiter, column 3\)"):
        read_rows(tmp_path / "broken.json")
    (tmp_path / "mixed.json").write_text('[{"a": 1}, [2]]')
    with pytest.raises(DatasetError, match=r"mixed.json: item 1 of the array \(from 0\) is a JSON list, not an object"):
        read_rows(tmp_path / "mixed.json")
    # a .jsonl file stays JSON Lines: one object per line
    (tmp_path / "arr.jsonl").write_text(json.dumps(rows))
    with pytest.raises(DatasetError, match=r"arr.jsonl: line 1 is a JSON list, not an object"):
        read_rows(tmp_path / "arr.jsonl")
    # latin-1 in an array: line 3 is '{"b": "caf\xe9"}', 10 characters before the é, so column 11
    (tmp_path / "latin1.json").write_bytes(b'[\n{"a": 1},\n{"b": "caf\xe9"}\n]\n')
    with pytest.raises(DatasetError, match=r"latin1.json: line 3 is not UTF-8 \(byte 0xe9 at column 11\)"):
        read_rows(tmp_path / "latin1.json")
