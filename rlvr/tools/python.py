"""The ``python`` tool: runs a model's code in a sandbox the kernel enforces.

Each call starts ``sandbox_launch.py`` (read its docstring for the mechanics), which gives the
code:

- its own mount namespace whose root is read-only and holds only ``/usr``, the library
  folders, the interpreter's prefix and five device nodes; the working folder ``/sandbox``
  (also ``/tmp``) is a size-limited tmpfs and the only writable place; home folders, the
  training data, the venv, ``/etc`` and every other host path are not there at all;
- its own PID namespace and ``/proc`` (it sees no host process), network namespace (no
  interface up), IPC and UTS namespaces;
- a uid of its own, no capability and no-new-privileges: when rlvr runs as root the code
  runs as a host uid from ``SANDBOX_UIDS`` that no other running call holds (gid 65534);
  otherwise it is uid 65534 inside a user namespace of its own, the trainer's uid outside;
- a seccomp filter: no fork, exec, ptrace, mount, unshare, setns, pivot_root, bpf, keyring,
  perf, io_uring or module calls (threads are allowed);
- resource limits: CPU seconds, address space, processes/threads, file size (stdout and
  stderr go to unlinked host files, so this caps them too), open files; a wall-clock timeout
  that kills the whole process group; a parent-death signal, so nothing outlives the trainer;
- a scrubbed environment and Python's isolated mode.

Calls at once: ``RLIMIT_NPROC`` counts the tasks of a uid (per user namespace since Linux
5.14), so sandboxes that shared one host uid refused each other's threads, and whether a
program passed depended on how many other rows called the tool in that turn. As root each
running call therefore gets a uid of its own (``sandbox_uid``). A trainer that is not root
cannot switch uids; there each call's user namespace gives it a count of its own on Linux
5.14 and later (on older kernels the calls, and the trainer's own processes, still share one
count, as before). A pids cgroup per call would do what the uids do, but needs a writable
cgroup hierarchy (v1 and v2 differ; containers often mount it read-only). At most
``rate_limit`` calls of a tool run at once (by default one per core this process may use):
the others wait, and their timeout starts once they run, so CPU-heavy calls do not time out
because of their neighbours.

Where the machine cannot create these namespaces (a container without user namespaces, a
kernel without seccomp) the tool refuses to start with the reason; there is no unsandboxed
fallback. Not contained: CPU and memory bandwidth shared with the trainer, and kernel
vulnerabilities (the code talks to the host kernel). For a boundary against those, run tools
on a remote sandbox service behind your own BaseTool.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import signal
import stat
import sys
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, AsyncContextManager, Iterator

from rlvr.tools import sandbox_launch
from rlvr.tools.base import BaseTool, CallSlots, ToolError
from rlvr.tools.schema import OpenAIFunctionToolSchema

# The base interpreter, not a virtual environment's link to it: the child needs no packages.
PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
LAUNCHER = os.path.realpath(sandbox_launch.__file__)
MOUNT_PREFIX = "rlvr-sandbox-"  # + the trainer's pid: an empty folder the sandbox's root is mounted on
SANDBOX_UIDS = range(2_000_000_000, 2_000_000_000 + 65536)
"""Host uids the code runs as when rlvr runs as root, one per running call: away from the
blocks handed out by default (accounts: up to 60000; /etc/subuid: 100000 to 600165535;
systemd-nspawn: 524288 to 1879048191). A uid that still has a process (the code of a call
that just ended, dying; a stranger) is counted into the new call's limit."""
UID_LOCKS = Path(tempfile.gettempdir()) / "rlvr-uid-locks"  # one lock file per uid ever taken


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or taskset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


REMOVED_KEYS = {"require_network_isolation": "the sandbox always runs in its own namespaces and refuses to start "
                                             "where the machine cannot create them; remove the key"}


@dataclass
class SandboxLimits:
    timeout_s: float = 10.0
    """Wall-clock seconds before the process group is killed."""
    cpu_time_s: int = 5
    memory_mb: int = 512
    """Address space of the child."""
    max_processes: int = 16
    """Threads the code may run (new processes are refused by the seccomp filter)."""
    max_file_mb: int = 16
    """Largest file the code may write (stdout and stderr included)."""
    disk_mb: int = 32
    """Size of the working folder's tmpfs (all files together)."""
    max_files: int = 1000
    """Files and folders the working folder may hold."""
    max_open_files: int = 64
    max_output_chars: int = 2000
    """Characters of stdout (and of stderr on failure) returned to the model."""
    rate_limit: int = field(default_factory=usable_cores)
    """Calls of this tool that run at once (verl's SandboxFusionTool key, also a cap on calls at
    once rather than a rate); the others wait, and their timeout starts once they run. Per
    tool and trainer process: two trainer processes on one host run up to twice as many."""

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str = "python tool config") -> "SandboxLimits":
        for key, why in REMOVED_KEYS.items():
            if key in config:
                raise ValueError(f"{where}: `{key}` is no longer a setting: {why}")
        known = {f.name for f in fields(cls)}
        unknown = set(config) - known - {"type"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
        limits = cls(**{k: v for k, v in config.items() if k in known})
        if isinstance(limits.rate_limit, bool) or not isinstance(limits.rate_limit, int) or limits.rate_limit < 1:
            raise ValueError(f"{where}: rate_limit (calls at once) must be an integer >= 1, got {limits.rate_limit!r}")
        return limits


@dataclass
class SandboxResult:
    exit_code: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    timed_out: bool


def _process_count(uid: int) -> int:
    """Processes on the host whose owner is ``uid`` (what ``RLIMIT_NPROC`` already counts for it)."""
    count = 0
    for entry in os.listdir("/proc"):
        try:
            count += entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid
        except OSError:
            pass
    return count


def _runs_as_root() -> bool:
    return os.geteuid() == 0


def _nproc_counts_per_user_namespace() -> bool:
    """Whether the kernel counts ``RLIMIT_NPROC`` per user namespace (Linux 5.14's ucounts)."""
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    return found is not None and (int(found[1]), int(found[2])) >= (5, 14)


def _uid_lock_dir() -> Path:
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    st = UID_LOCKS.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ToolError(f"{UID_LOCKS} must be a folder of uid {os.geteuid()} that no one else can write (it holds "
                        "the sandboxes' uid locks); remove it and it is made again")
    return UID_LOCKS


@contextlib.contextmanager
def sandbox_uid() -> Iterator[int]:
    """The first uid of ``SANDBOX_UIDS`` that no running sandbox holds, held until the block
    ends. The hold is an flock on the uid's lock file, so it is seen by every trainer process
    on the host and released by the kernel when a trainer dies."""
    lock_dir = _uid_lock_dir()
    for uid in SANDBOX_UIDS:
        fd = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)
        return
    raise ToolError(f"all {len(SANDBOX_UIDS)} sandbox uids are held by running calls")


def _code_uid() -> contextlib.AbstractContextManager[int]:
    """The uid the code runs as: its own host uid when rlvr is root, else 65534 in its user namespace."""
    return sandbox_uid() if _runs_as_root() else contextlib.nullcontext(sandbox_launch.SANDBOX_ID)


def _launch_spec(limits: SandboxLimits, mount_point: Path, uid: int) -> str:
    """``uid``: the code's uid (on the host when root; else inside its user namespace)."""
    as_root = _runs_as_root()
    if as_root:  # the uid is this call's alone; a process of it still dying is counted in
        nproc = _process_count(uid) + limits.max_processes
    elif _nproc_counts_per_user_namespace():  # the namespace holds the launcher and the code
        nproc = 1 + limits.max_processes
    else:  # one count for the trainer's uid: its processes and every sandbox's
        nproc = _process_count(os.getuid()) + limits.max_processes
    prefix = os.path.realpath(sys.base_prefix)
    return json.dumps({
        "parent": os.getpid(), "as_root": as_root, "uid": uid, "root": str(mount_point), "python": PYTHON,
        "binds": sorted({prefix, os.path.dirname(PYTHON)}),
        "env": {"PATH": "/usr/bin:/bin", "HOME": sandbox_launch.WORKDIR, "TMPDIR": sandbox_launch.WORKDIR,
                "LANG": "C.UTF-8"},
        "nproc": nproc, "cpu_time_s": limits.cpu_time_s,
        "memory_mb": limits.memory_mb, "max_file_mb": limits.max_file_mb, "max_open_files": limits.max_open_files,
        "disk_mb": limits.disk_mb, "max_files": limits.max_files})


def _read_capped(f, limit: int, tail: bool = False) -> str:
    """At most ``limit`` characters of an open file: its start, or with ``tail`` its end (where
    a traceback's exception is)."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - limit * 4 - 4) if tail else 0)
    text = f.read(limit * 4 + 4).decode("utf-8", errors="replace")
    if len(text) <= limit:
        return text
    if tail:
        return f"[... output truncated to its last {limit} characters]\n" + text[-limit:]
    return text[:limit] + f"\n... [output truncated at {limit} characters]"


def remove_stale_mount_points() -> None:
    """Empty mount points left by trainers that were killed mid-call (SIGKILL runs no cleanup)."""
    for path in Path(tempfile.gettempdir()).glob(MOUNT_PREFIX + "*"):
        pid = path.name[len(MOUNT_PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


async def run_sandboxed(code: str, limits: SandboxLimits) -> SandboxResult:
    """Run ``code`` as ``/sandbox/main.py`` in a fresh sandbox under ``limits``."""
    mount_point = Path(tempfile.mkdtemp(prefix=f"{MOUNT_PREFIX}{os.getpid()}-"))
    mount_point.chmod(0o755)
    try:
        with (_code_uid() as uid, tempfile.TemporaryFile() as source, tempfile.TemporaryFile() as out,
              tempfile.TemporaryFile() as err):
            source.write(code.encode("utf-8", "backslashreplace"))
            source.seek(0)
            proc = await asyncio.create_subprocess_exec(
                PYTHON, "-I", "-S", LAUNCHER, "launch", _launch_spec(limits, mount_point, uid),
                cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, stdin=source, stdout=out, stderr=err,
                start_new_session=True)
            timed_out = False
            try:
                await asyncio.wait_for(proc.wait(), limits.timeout_s)
            except asyncio.TimeoutError:
                timed_out = True
            finally:  # the whole group, also when cancelled (Ctrl-C) or when the code left threads behind
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await asyncio.shield(proc.wait())
            return SandboxResult(None if timed_out else proc.returncode, _read_capped(out, limits.max_output_chars),
                                 _read_capped(err, limits.max_output_chars, tail=True), timed_out)
    finally:
        shutil.rmtree(mount_point, ignore_errors=True)


def sandbox_error() -> str | None:
    """Why this machine cannot run the sandbox, or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux namespaces (this is {sys.platform})"
    if platform.machine() not in sandbox_launch.SYSCALLS:
        return f"the sandbox's seccomp filter knows no syscall table for {platform.machine()}"
    try:
        result = asyncio.run(asyncio.wait_for(run_sandboxed("print('ok')", SandboxLimits()), 60))
    except (OSError, asyncio.TimeoutError) as err:
        return f"the sandbox could not start: {err}"
    if result.exit_code != 0 or result.stdout != "ok\n":
        return f"the sandbox could not start: {result.stderr.strip() or f'exit code {result.exit_code}'}"
    return None


class PythonTool(BaseTool):
    """``python(code)``: run a Python program and return what it prints (``rate_limit`` calls at once)."""

    def __init__(self, config: dict | None, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self.limits = SandboxLimits.from_config(self.config, f"tool {self.name!r} config")
        self.slots = CallSlots(self.limits.rate_limit)
        remove_stale_mount_points()
        why = sandbox_error()
        if why is not None:
            raise ToolError(
                f"tool {self.name!r}: cannot sandbox the model's code on this machine ({why}); allow user namespaces "
                "(e.g. `sysctl kernel.unprivileged_userns_clone=1`, or run the container with namespaces allowed), "
                "or serve the tool from a remote sandbox behind your own BaseTool")

    @classmethod
    def default_schema(cls) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.from_dict({"type": "function", "function": {
            "name": "python",
            "description": "Run a Python program in a sandbox (no network, limited time and memory) and return "
                           "what it prints.",
            "parameters": {"type": "object", "properties": {
                "code": {"type": "string", "description": "the program; print() the results you need"}},
                "required": ["code"]}}})

    def call_slot(self) -> AsyncContextManager[None]:
        return self.slots.hold()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs) -> tuple[str, float, dict]:
        async with self.slots.hold():  # already held when the rollout calls: then it does not wait again
            result = await run_sandboxed(str(parameters.get("code", "")), self.limits)
        if result.timed_out:
            raise ToolError(f"the program did not finish within {self.limits.timeout_s:g} s and was stopped")
        if result.exit_code != 0:
            reason = f"exit code {result.exit_code}" if result.exit_code > 0 else f"signal {-result.exit_code}"
            raise ToolError(f"the program failed ({reason}):\n{result.stderr.strip() or result.stdout.strip()}")
        return result.stdout if result.stdout.strip() else "(no output)", 0.0, {}
