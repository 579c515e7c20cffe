"""The ``python`` tool: runs a model's code in a separate, limited process.

Each call gets a fresh temporary working directory and a child process with:

- resource limits: CPU seconds, address space, number of processes, file size (which also
  caps the captured output: stdout and stderr go to files), open files;
- a wall-clock timeout that kills the child's whole process group;
- a scrubbed environment (``PATH``, ``HOME`` = the working directory, ``LANG``) and Python's
  isolated mode (no user site, no ``PYTHON*`` variables);
- no network: the child runs in new user, network and PID namespaces (``unshare``), so it has
  only a loopback interface that is down, sees no process outside its own, and has no
  capability outside its namespace (so it cannot raise its limits, even when rlvr runs as root);
- an audit hook (PEP 578) installed before the code runs that refuses writes outside the
  working directory, reading other processes' ``/proc`` files (e.g. the parent's environment),
  starting processes, changing limits, sockets and ``ctypes``. The kernel does not enforce the
  process limit for root, so when rlvr runs as root the hook is what stops a fork bomb.

Where the machine does not allow namespaces the tool refuses to start, unless the tools YAML
sets ``require_network_isolation: false`` (the code then shares the machine's network).

This contains the mistakes and mischief of a model being trained (fork bombs, memory bombs,
infinite loops, stray writes); it is not a boundary against a determined attacker with a
kernel exploit. For that, run tools on a remote sandbox service behind your own BaseTool.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rlvr.tools.base import BaseTool, ToolError
from rlvr.tools.schema import OpenAIFunctionToolSchema

# The base interpreter, not a virtual environment's link to it: the child needs no packages.
PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]

# Runs in the child before the model's code: the audit hook cannot be removed once added.
_BOOTSTRAP = r'''
import os, sys
WORK = os.getcwd()
OWN = str(os.getpid())
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
BLOCKED = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
           "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym",
           "ctypes.cdata", "os.kill", "os.killpg", "resource.setrlimit", "resource.prlimit"}
NO_IMPORT = {"_posixsubprocess", "_ctypes"}  # process creation and foreign calls without an audit event
PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
               "os.truncate", "os.utime", "shutil.rmtree", "os.chdir"}

def inside(path):
    return os.path.realpath(os.path.join(WORK, os.fsdecode(path))).startswith(WORK + os.sep)

def hook(event, args):
    if event in BLOCKED or event == "import" and args[0] in NO_IMPORT:
        raise PermissionError(f"sandbox: {event} {args[0] if event == 'import' else ''}".strip() + " is not allowed")
    if event == "open" and not isinstance(args[0], int):
        path = os.fsdecode(args[0])
        if (args[2] or 0) & WRITE and not inside(path):
            raise PermissionError(f"sandbox: writing outside the working directory ({path})")
        parts = os.path.abspath(path).split(os.sep)
        if len(parts) > 2 and parts[1] == "proc" and parts[2] not in ("self", "thread-self", OWN):
            raise PermissionError(f"sandbox: reading another process's files ({path})")
    elif event in PATH_EVENTS and args and isinstance(args[0], (str, bytes)) and not inside(args[0]):
        raise PermissionError(f"sandbox: {event} outside the working directory")

import signal

def cpu_limit(signum, frame):
    raise TimeoutError("sandbox: the CPU time limit was reached")

signal.signal(signal.SIGXCPU, cpu_limit)  # the soft limit; the hard limit one second later kills
source = open("main.py").read()
code = compile(source, "main.py", "exec")
sys.addaudithook(hook)
exec(code, {"__name__": "__main__"})
'''


@dataclass
class SandboxLimits:
    timeout_s: float = 10.0
    """Wall-clock seconds before the process group is killed."""
    cpu_time_s: int = 5
    memory_mb: int = 512
    """Address space of the child."""
    max_processes: int = 16
    max_file_mb: int = 16
    """Largest file the code may write (stdout and stderr included)."""
    max_open_files: int = 64
    max_output_chars: int = 2000
    """Characters of stdout (and of stderr on failure) returned to the model."""
    require_network_isolation: bool = True
    """Refuse to start where the machine cannot give the child a network namespace."""

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "python tool config") -> "SandboxLimits":
        known = {f.name for f in fields(cls)}
        unknown = set(config) - known - {"type"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        return cls(**{k: v for k, v in config.items() if k in known})


@dataclass
class SandboxResult:
    exit_code: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    timed_out: bool


def _process_count(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        try:
            count += entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid
        except OSError:
            pass
    return count


def _limit_child(limits: SandboxLimits):
    """The preexec function: set the limits (they survive exec)."""
    mb = 1024 * 1024
    nproc_base = _process_count(os.getuid())  # the limit counts every process of the user

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails instead of killing
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_time_s, limits.cpu_time_s + 1))
        for res, value in ((resource.RLIMIT_AS, limits.memory_mb * mb),
                           (resource.RLIMIT_NPROC, nproc_base + limits.max_processes),
                           (resource.RLIMIT_FSIZE, limits.max_file_mb * mb),
                           (resource.RLIMIT_NOFILE, limits.max_open_files), (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(res, (value, value))

    return apply


def network_isolation_error() -> str | None:
    """Why the child cannot get a network namespace here, or None when it can."""
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        return "the unshare command (util-linux) is not available"
    try:
        probe = subprocess.run([*UNSHARE, PYTHON, "-I", "-S", "-c", "pass"], capture_output=True, text=True,
                               timeout=30, preexec_fn=_limit_child(SandboxLimits()))
    except (OSError, subprocess.SubprocessError) as err:  # cannot start, or hangs
        return f"`unshare --user --net --pid python` could not run: {err}"
    if probe.returncode != 0:
        return f"`unshare --user --net --pid python` failed: {probe.stderr.strip() or probe.returncode}"
    return None


def _read_capped(path: Path, limit: int, tail: bool = False) -> str:
    """At most ``limit`` characters of a file: its start, or with ``tail`` its end (where a
    traceback's exception is)."""
    with open(path, "rb") as f:
        if tail:
            f.seek(max(0, path.stat().st_size - limit * 4 - 4))
        data = f.read(limit * 4 + 4)
    text = data.decode("utf-8", errors="replace")
    if len(text) <= limit:
        return text
    if tail:
        return f"[... output truncated to its last {limit} characters]\n" + text[-limit:]
    return text[:limit] + f"\n... [output truncated at {limit} characters]"


async def run_sandboxed(code: str, limits: SandboxLimits, isolate_network: bool = True) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh directory under ``limits``."""
    work = Path(tempfile.mkdtemp(prefix="rlvr-python-"))
    try:
        (work / "main.py").write_text(code)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8"}
        argv = [*(UNSHARE if isolate_network else []), PYTHON, "-I", "-S", "-c", _BOOTSTRAP]
        with open(work / ".stdout", "wb") as out, open(work / ".stderr", "wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                preexec_fn=_limit_child(limits))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), limits.timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:  # the whole group, also when the code exited but left children behind
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
        return SandboxResult(None if timed_out else proc.returncode, _read_capped(work / ".stdout", limits.max_output_chars),
                             _read_capped(work / ".stderr", limits.max_output_chars, tail=True), timed_out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class PythonTool(BaseTool):
    """``python(code)``: run a Python program and return what it prints."""

    def __init__(self, config: dict | None, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self.limits = SandboxLimits.from_config(self.config, f"tool {self.name!r} config")
        self.isolate_network = True
        why = network_isolation_error()
        if why is not None:
            if self.limits.require_network_isolation:
                raise ToolError(
                    f"tool {self.name!r}: cannot isolate the sandboxed code from the network ({why}); allow user "
                    "namespaces on this machine, or set `require_network_isolation: false` in the tool's config "
                    "to run code with the machine's network (not recommended)")
            self.isolate_network = False

    @classmethod
    def default_schema(cls) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.from_dict({"type": "function", "function": {
            "name": "python",
            "description": "Run a Python program in a sandbox (no network, limited time and memory) and return "
                           "what it prints.",
            "parameters": {"type": "object", "properties": {
                "code": {"type": "string", "description": "the program; print() the results you need"}},
                "required": ["code"]}}})

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs) -> tuple[str, float, dict]:
        result = await run_sandboxed(str(parameters.get("code", "")), self.limits, self.isolate_network)
        if result.timed_out:
            raise ToolError(f"the program did not finish within {self.limits.timeout_s:g} s and was stopped")
        if result.exit_code != 0:
            reason = f"exit code {result.exit_code}" if result.exit_code > 0 else f"signal {-result.exit_code}"
            raise ToolError(f"the program failed ({reason}):\n{result.stderr.strip() or result.stdout.strip()}")
        return result.stdout if result.stdout.strip() else "(no output)", 0.0, {}
