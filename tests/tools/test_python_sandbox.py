"""The python tool under attack: each attack is contained, reported as a tool error, and the
next call works. (The tool-error path into the rollout is tested in tests/rollout.)"""

import asyncio
import os
from pathlib import Path

import pytest

from rlvr.tools import ToolError
from rlvr.tools import python as sandbox
from rlvr.tools.python import PythonTool

pytestmark = pytest.mark.skipif(sandbox.network_isolation_error() is not None,
                                reason="this machine cannot create the sandbox's namespaces")


@pytest.fixture(scope="module")
def tool():
    return PythonTool({"timeout_s": 3, "cpu_time_s": 2, "memory_mb": 256, "max_output_chars": 200}, None)


def call(tool, code):
    return asyncio.run(tool.execute("i", {"code": code}))


def test_runs_code_and_returns_its_output(tool):
    assert call(tool, "print(sum(range(10)))")[0] == "45\n"
    assert call(tool, "x = 1")[0] == "(no output)"


ATTACKS = {
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "os.fork is not allowed"),
    "subprocess": ("import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])", "_posixsubprocess is not allowed"),
    "memory bomb": ("x = bytearray(4 * 1024 ** 3)", "MemoryError"),
    "infinite loop": ("while True:\n    pass", "CPU time limit was reached"),
    "socket connect": ("import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('1.1.1.1', 80))",
                       "socket.connect is not allowed"),
    "write outside": ("open('/tmp/rlvr-sandbox-escape.txt', 'w').write('x')", "writing outside the working directory"),
    "parent environment": ("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())",
                           "reading another process's files"),
    "raise limits": ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
                     "resource.setrlimit is not allowed"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).fork()", "_ctypes is not allowed"),
    "sleeping": ("import time\ntime.sleep(60)", "did not finish within 3 s"),
    "exception": ("raise ValueError('bad input')", "ValueError: bad input"),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attacks_are_contained_and_reported(tool, name):
    code, message = ATTACKS[name]
    with pytest.raises(ToolError, match=message):
        call(tool, code)
    assert call(tool, "print('still fine')")[0] == "still fine\n"  # the tool keeps working
    assert not Path("/tmp/rlvr-sandbox-escape.txt").exists()


def test_environment_is_scrubbed(tool, monkeypatch):
    monkeypatch.setenv("RLVR_SECRET_TOKEN", "hunter2")
    out = call(tool, "import os\nprint(sorted(os.environ))")[0]
    assert "RLVR_SECRET_TOKEN" not in out and "hunter2" not in out
    assert out.strip() == "['HOME', 'LANG', 'PATH']"


def test_network_is_isolated_even_without_the_hook():
    """Below the audit hook: in the child's namespaces there is no route out (ENETUNREACH)."""
    import errno
    import subprocess

    code = "import socket\ns = socket.socket()\ns.settimeout(1)\nprint(s.connect_ex(('1.1.1.1', 80)))"
    out = subprocess.run([*sandbox.UNSHARE, sandbox.PYTHON, "-I", "-c", code], capture_output=True, text=True, timeout=30)
    assert int(out.stdout) == errno.ENETUNREACH


def test_output_is_capped(tool):
    text = call(tool, "print('x' * 100000)")[0]
    assert text.startswith("x" * 200) and "[output truncated at 200 characters]" in text


def test_writes_inside_the_working_directory_are_allowed_and_removed(tool):
    assert call(tool, "open('notes.txt', 'w').write('hi')\nprint(open('notes.txt').read())")[0] == "hi\n"
    assert call(tool, "import os\nprint(os.path.exists('notes.txt'))")[0] == "False\n"  # a fresh directory per call


def test_refuses_to_start_without_network_isolation(monkeypatch):
    monkeypatch.setattr(sandbox, "network_isolation_error", lambda: "unshare is not available")
    with pytest.raises(ToolError, match="cannot isolate the sandboxed code from the network.*require_network_isolation"):
        PythonTool({}, None)
    allowed = PythonTool({"require_network_isolation": False}, None)
    assert allowed.isolate_network is False


def test_unknown_limit_keys_are_refused():
    with pytest.raises(ValueError, match=r"unknown keys \['memory'\]"):
        PythonTool({"memory": 1}, None)


def test_no_process_is_left_behind(tool):
    before = {p for p in os.listdir("/proc") if p.isdigit()}
    with pytest.raises(ToolError):
        call(tool, "while True:\n    pass")
    after = {p for p in os.listdir("/proc") if p.isdigit()}
    leftover = [p for p in after - before
                if Path(f"/proc/{p}/cmdline").exists() and b"-I\x00-S" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert leftover == []
