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
