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
