"""`rlvr prepare`'s option errors are one message naming the option, not a ValueError traceback
from the task's spec (issue 47, §2)."""

import pytest

from rlvr.cli import main


@pytest.mark.parametrize("args, message", [
    (["--operators", "%"], "--operators must be a non-empty subset of '+-*/', got '%'"),
    (["--operators", ""], "--operators must be a non-empty subset of '+-*/', got ''"),
    (["--digits", "0"], "--digits must be >= 1, got 0"),
    (["--num-operands", "1"], "--num-operands must be >= 2, got 1"),
    (["--max-operand", "-3"], "--max-operand must be >= 1, got -3"),
])
def test_a_bad_arithmetic_option_is_named(tmp_path, capsys, args, message):
    assert main(["prepare", "arithmetic", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err == f"rlvr prepare: error: {message}\n", err
    assert not any(tmp_path.iterdir())  # nothing written


def test_digits_is_not_silently_overridden_by_the_default_max_operand(tmp_path, capsys):
    """`--digits 3` wrote the same 0..20 problems as no option at all (the default --max-operand 20
    replaced the digits' bound), and `--digits 1` gave operands up to 20, not 0..9."""
    import re

    from rlvr.data.io import read_rows

    # 3 digits need operands from 100 up; under --max-operand 20 none can have 3 digits
    assert main(["prepare", "arithmetic", "--out", str(tmp_path / "d3"), "--digits", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr prepare: error: --digits must be <= 2 under max-operand=20"), err
    assert not (tmp_path / "d3").exists() or not any((tmp_path / "d3").iterdir())
    # --digits 1 caps the default 20 at 9 (one digit: 0..9)
    assert main(["prepare", "arithmetic", "--out", str(tmp_path / "d1"), "--digits", "1", "--train-size", "60",
                 "--test-size", "20"]) == 0
    expressions = [r["extra_info"]["expression"] for r in read_rows(tmp_path / "d1" / "train.parquet")]
    assert max(int(n) for e in expressions for n in re.findall(r"\d+", e)) <= 9
    # with --max-operand 0 the digits alone bound the operands: 3 digits reach past 99
    assert main(["prepare", "arithmetic", "--out", str(tmp_path / "m0"), "--digits", "3", "--max-operand", "0",
                 "--train-size", "60", "--test-size", "20"]) == 0
    expressions = [r["extra_info"]["expression"] for r in read_rows(tmp_path / "m0" / "train.parquet")]
    assert 99 < max(int(n) for e in expressions for n in re.findall(r"\d+", e)) <= 999
