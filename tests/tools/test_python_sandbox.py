"""The python tool under attack. Every attack is written as model code would be, with the whole
of Python at hand (ctypes included): nothing in the sandboxed interpreter guards anything, so
each route must end contained by the kernel (namespaces, a read-only root, uid 65534 without
capabilities, seccomp, limits). The expected outputs are written by hand: the errno a Linux
kernel gives for each route. (The tool-error path into the rollout is tested in tests/rollout.)"""

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.tools import ToolError, load_tools
from rlvr.tools import python as sandbox
from rlvr.tools.python import SANDBOX_UIDS, PythonTool, SandboxLimits, run_sandboxed
from tests.processes import alive, alive_descendants, descendants

pytestmark = pytest.mark.skipif(sandbox.sandbox_error() is not None,
                                reason="this machine cannot create the sandbox's namespaces")

PREFIX = os.path.realpath(sys.base_prefix)  # visible inside, read-only
REPO = Path(__file__).resolve().parents[2]  # not visible inside

# Prepended to attacks: print each route's outcome as "name: ok" or "name: ERRNO".
ATTEMPT = '''import ctypes, errno, os, shutil
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, fn):
    try:
        result = fn()
    except OSError as e:
        print(f"{name}: {errno.errorcode[e.errno]}")
        return
    if isinstance(result, int) and result < 0:  # a raw libc call: -1 and errno
        print(f"{name}: {errno.errorcode[ctypes.get_errno()]}")
    else:
        print(f"{name}: ok")
'''


@pytest.fixture(scope="module")
def tool():
    return PythonTool({"timeout_s": 3, "cpu_time_s": 2, "memory_mb": 256, "max_output_chars": 2000,
                       "disk_mb": 4, "max_files": 50}, None)


def call(tool, code):
    return asyncio.run(tool.execute("i", {"code": code}))


def routes(tool, body):
    return call(tool, ATTEMPT + body)[0].splitlines()


def test_runs_code_and_returns_its_output(tool):
    assert call(tool, "print(sum(range(10)))")[0] == "45\n"
    assert call(tool, "x = 1")[0] == "(no output)"


REPORTED = {
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "PermissionError: \\[Errno 1\\] Operation not permitted"),
    "subprocess": ("import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])", "PermissionError"),
    "memory bomb": ("x = bytearray(4 * 1024 ** 3)", "MemoryError"),
    "infinite loop": ("while True:\n    pass", "CPU time limit was reached"),
    "socket connect": ("import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('1.1.1.1', 80))",
                       "Network is unreachable"),
    "raise limits": ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
                     "not allowed to raise maximum limit"),
    "sleeping": ("import time\ntime.sleep(60)", "did not finish within 3 s"),
    "exception": ("raise ValueError('bad input')", "ValueError: bad input"),
}


@pytest.mark.parametrize("name", list(REPORTED))
def test_failures_are_reported_and_the_tool_keeps_working(tool, name):
    code, message = REPORTED[name]
    with pytest.raises(ToolError, match=message):
        call(tool, code)
    assert call(tool, "print('still fine')")[0] == "still fine\n"


def test_traceback_starts_at_the_models_code(tool):
    with pytest.raises(ToolError) as info:
        call(tool, "def f():\n    return 1 / 0\nf()")
    text = str(info.value)
    assert 'File "main.py", line 3' in text and "ZeroDivisionError" in text and "sandbox_launch" not in text


def test_writes_outside_the_working_folder_never_reach_the_host(tool, tmp_path):
    """The routes an audit hook missed: rename/replace/link/symlink destinations (shutil.move),
    dir_fd-relative calls, fchdir, mkfifo, a subinterpreter, raw libc calls. Targets are the
    interpreter's own folder (visible, read-only: EROFS) and the host's temporary folder and
    repository (not mounted at all: ENOENT)."""
    visible = f"{PREFIX}/lib/rlvr-escape"
    hidden = f"{tmp_path}/escape"
    repo = f"{REPO}/rlvr-escape"
    body = f'''open("r.txt", "w").write("x")
attempt("open", lambda: open("{visible}", "w"))
attempt("open hidden", lambda: open("{hidden}", "w"))
attempt("open repo", lambda: open("{repo}", "w"))
attempt("shutil.move", lambda: shutil.move("r.txt", "{visible}"))
attempt("replace", lambda: os.replace("r.txt", "{visible}"))
attempt("link", lambda: os.link("r.txt", "{visible}"))
attempt("symlink", lambda: os.symlink("/sandbox/r.txt", "{visible}"))
attempt("mkfifo", lambda: os.mkfifo("{visible}"))
attempt("mkdir", lambda: os.mkdir("{visible}"))
root = os.open("/", os.O_RDONLY)
attempt("dir_fd open", lambda: os.open("{visible[1:]}", os.O_CREAT | os.O_WRONLY, dir_fd=root))
attempt("dir_fd unlink", lambda: os.unlink("{PREFIX[1:]}/lib/libpython3.11.so.1.0", dir_fd=root))
os.fchdir(root)
attempt("fchdir write", lambda: open("{visible[1:]}", "w"))
os.chdir("/sandbox")
attempt("libc open", lambda: libc.open(b"{visible}", os.O_CREAT | os.O_WRONLY, 0o644))
attempt("libc rename", lambda: libc.rename(b"r.txt", b"{visible}"))
attempt("write /usr", lambda: open("/usr/bin/python3", "a"))
attempt("remount", lambda: libc.mount(None, b"/", None, 32, None))
import _xxsubinterpreters as interpreters
sub = interpreters.create()
try:
    interpreters.run_string(sub, 'open("{visible}", "w")')
except Exception as e:
    print("subinterpreter:", "Read-only file system" in str(e))
'''
    # rename across mounts fails with EXDEV before the read-only check (link checks read-only
    # first); shutil.move then falls back to a copy, which meets the read-only root. Root's
    # existing files refuse uid 65534 (EACCES) before the read-only mount is asked.
    assert routes(tool, body) == [
        "open: EROFS", "open hidden: ENOENT", "open repo: ENOENT", "shutil.move: EROFS", "replace: EXDEV",
        "link: EROFS", "symlink: EROFS", "mkfifo: EROFS", "mkdir: EROFS", "dir_fd open: EROFS",
        "dir_fd unlink: EROFS", "fchdir write: EROFS", "libc open: EROFS", "libc rename: EXDEV",
        "write /usr: EACCES", "remount: EPERM", "subinterpreter: True"]
    for path in (visible, hidden, repo):
        assert not os.path.lexists(path)


def test_host_files_are_not_visible(tool, tmp_path):
    """Home folders, /etc, the training data, the venv and the host's temporary files are not
    in the sandbox's file system: only the interpreter and system libraries are."""
    secret = tmp_path / "ground_truth.jsonl"
    secret.write_text('{"answer": 42}')
    home = os.path.expanduser("~")
    body = f'''
attempt("tmp secret", lambda: open("{secret}").read())
attempt("home", lambda: os.listdir("{home}"))
attempt("etc passwd", lambda: open("/etc/passwd").read())
attempt("etc shadow", lambda: open("/etc/shadow").read())
attempt("venv", lambda: os.listdir("{REPO}/.venv"))
attempt("sys", lambda: os.listdir("/sys"))
attempt("library", lambda: open("{PREFIX}/lib/python3.11/os.py").read())
print(sorted(os.listdir("/sandbox")), os.path.realpath("/tmp"))
'''
    home_result = "ENOENT" if not PREFIX.startswith(home + "/") else "ok"  # the prefix's parents exist inside
    assert routes(tool, body) == [
        "tmp secret: ENOENT", f"home: {home_result}", "etc passwd: ENOENT", "etc shadow: ENOENT", "venv: ENOENT",
        "sys: ENOENT", "library: ok", "['main.py'] /sandbox"]
    top = set(call(tool, "import os\nprint(*sorted(os.listdir('/')))")[0].split())
    assert top <= {"usr", "bin", "sbin", "lib", "lib64", "lib32", "libx32", "etc", "dev", "proc", "sandbox", "tmp",
                   PREFIX.split("/")[1]}
    if PREFIX.startswith(home + "/"):  # only the path down to the interpreter, nothing beside it
        inside = call(tool, f"import os\nprint(os.listdir('{home}'))")[0]
        assert inside == f"['{PREFIX[len(home) + 1:].split('/')[0]}']\n"


def test_proc_shows_only_the_sandbox(tool):
    out = call(tool, "import os\nprint(sorted(p for p in os.listdir('/proc') if p.isdigit()), os.getpid(), "
                     "os.getppid())")[0]
    assert out == "['1'] 1 0\n"  # the host's processes (the trainer first) are not there


def test_no_privileges_inside_and_seccomp_refuses_the_rest(tool):
    body = '''
print("ids", os.getuid(), os.geteuid(), os.getgid())
status = dict(line.split(":\\t") for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
print("caps", status["CapEff"], status["CapBnd"], "nnp", status["NoNewPrivs"], "seccomp", status["Seccomp"])
attempt("setuid 0", lambda: os.setuid(0))
attempt("unshare user", lambda: libc.unshare(0x10000000))
attempt("ptrace", lambda: libc.ptrace(0, 0, None, None))
attempt("execv", lambda: os.execv("/usr/bin/true", ["true"]))
attempt("fork", lambda: os.fork())
attempt("system", lambda: -1 if os.system("echo escaped") != 0 else 0)
attempt("chroot", lambda: os.chroot("/sandbox"))
attempt("kill the trainer", lambda: os.kill(TRAINER, 9))
'''.replace("TRAINER", str(os.getpid()))  # a host pid: not in the sandbox's PID namespace
    lines = routes(tool, body)
    uid, euid, gid = map(int, lines[0].split()[1:])
    assert uid == euid and (uid in SANDBOX_UIDS if os.geteuid() == 0 else uid == 65534) and gid == 65534
    assert lines[1:] == [
        "caps 0000000000000000 0000000000000000 nnp 1 seccomp 2",
        "setuid 0: EPERM", "unshare user: EPERM", "ptrace: EPERM", "execv: EPERM", "fork: EPERM",
        "system: EPERM", "chroot: EPERM", "kill the trainer: ESRCH"]


def test_the_user_namespace_path_for_a_trainer_that_is_not_root(tool, monkeypatch):
    """A trainer that is not root gets a user namespace mapping uid 65534 inside to its own uid.
    Taken here by telling the launcher it is not root (the map then points at root outside, but
    what the code can do inside is the same): the mounts, the capability drop and seccomp hold."""
    monkeypatch.setattr(sandbox, "_runs_as_root", lambda: False)
    body = f'''
print("ids", os.getuid(), sorted(p for p in os.listdir("/proc") if p.isdigit()))
print("caps", open("/proc/self/status").read().split("CapEff:\\t")[1][:16])
attempt("open", lambda: open("{PREFIX}/lib/rlvr-escape", "w"))
attempt("unshare user", lambda: libc.unshare(0x10000000))
attempt("mount", lambda: libc.mount(b"tmpfs", b"/usr", b"tmpfs", 0, None))
attempt("fork", lambda: os.fork())
attempt("home", lambda: open("{REPO}/pyproject.toml"))
'''
    assert routes(tool, body) == ["ids 65534 ['1']", "caps 0000000000000000", "open: EROFS", "unshare user: EPERM",
                                  "mount: EPERM", "fork: EPERM", "home: ENOENT"]


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def test_outside_the_namespace_the_code_is_unprivileged_too():
    """Seen from the host, the running code's uid is one of SANDBOX_UIDS when rlvr runs as root
    (the trainer's own uid otherwise): not root, so file permissions and RLIMIT_NPROC apply to it."""
    earlier = set(descendants(os.getpid()))  # e.g. a pool an earlier test left running

    async def watch():
        task = asyncio.ensure_future(run_sandboxed("import time\ntime.sleep(60)", SandboxLimits(timeout_s=90)))
        for _ in range(400):
            await asyncio.sleep(0.05)
            pids = [p for p in alive_descendants(os.getpid()) if p not in earlier]
            if len(pids) >= 2 and b"\x00-c\x00" in Path(f"/proc/{pids[-1]}/cmdline").read_bytes():
                break  # the code's interpreter (stage 2) runs: the launcher's setup is over
        uids = {_uid(p) for p in pids}
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return pids, uids

    pids, uids = asyncio.run(watch())
    expected = SANDBOX_UIDS if os.geteuid() == 0 else [os.getuid()]
    assert len(pids) == 2 and any(u in expected for u in uids) and (os.geteuid() != 0 or 0 in uids)  # launcher, code
    # cancelled: the group was killed. The code, PID 1's child in its PID namespace, is killed by the kernel
    # when PID 1 dies, which on a loaded machine may come a moment after the launcher is reaped: allow 2 s
    # (the code itself sleeps 60 s, so only the kill can end it)
    deadline = time.monotonic() + 2
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(alive(p) for p in pids)


def test_working_folder_is_size_limited(tool):
    body = '''
def fill():
    with open("big", "wb") as f:
        for _ in range(64):
            f.write(b"x" * 1024 * 1024)
attempt("64 MB", fill)
def many():
    for i in range(100):
        open(f"f{i}", "w").close()
attempt("100 files", many)
'''
    assert routes(tool, body) == ["64 MB: ENOSPC", "100 files: ENOSPC"]  # disk_mb=4, max_files=50


def test_environment_is_scrubbed(tool, monkeypatch):
    monkeypatch.setenv("RLVR_SECRET_TOKEN", "hunter2")
    out = call(tool, "import os\nprint(sorted(os.environ))")[0]
    assert out.strip() == "['HOME', 'LANG', 'PATH', 'TMPDIR']"


def test_output_is_capped():
    small = PythonTool({"max_output_chars": 200}, None)
    text = call(small, "print('x' * 100000)")[0]
    assert text.startswith("x" * 200) and "[output truncated at 200 characters]" in text


def test_writes_inside_the_working_folder_are_allowed_and_removed(tool):
    assert call(tool, "open('notes.txt', 'w').write('hi')\nprint(open('notes.txt').read())")[0] == "hi\n"
    assert call(tool, "open('/tmp/t', 'w').write('t')\nprint(open('/sandbox/t').read())")[0] == "t\n"
    assert call(tool, "import os\nprint(os.listdir('.'))")[0] == "['main.py']\n"  # a fresh folder per call


def test_refuses_to_start_where_the_machine_cannot_sandbox(monkeypatch):
    monkeypatch.setattr(sandbox, "sandbox_error", lambda: "unshare (user namespaces): Operation not permitted")
    with pytest.raises(ToolError, match="cannot sandbox the model's code on this machine .unshare .user namespaces"):
        PythonTool({}, None)


def test_unknown_and_removed_limit_keys_are_refused():
    with pytest.raises(ValueError, match=r"unknown keys \['memory'\]"):
        PythonTool({"memory": 1}, None)
    with pytest.raises(ValueError, match="require_network_isolation` is no longer a setting"):
        PythonTool({"require_network_isolation": False}, None)


# Calls at once. Each program below waits for the test's SIGUSR1 before it goes on, so the test
# decides which sandboxes run together; it finds the waiting ones from the host (a sandbox's
# PID 1 that catches SIGUSR1).
WAIT_FOR_GO = """import os, signal, threading, time
go = []
signal.signal(signal.SIGUSR1, lambda *_: go.append(1))
while not go:
    time.sleep(0.01)
"""


def _sandboxes_waiting(earlier: set[int]) -> list[int]:
    """The code of this process's sandboxes (PID 1 in a namespace of its own) that catches SIGUSR1."""
    waiting = []
    for pid in alive_descendants(os.getpid()):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        caught = int(re.search(r"SigCgt:\t(\w+)", status)[1], 16)
        if pid not in earlier and re.search(r"NSpid:\t\d+\t1\n", status) and caught & (1 << signal.SIGUSR1 - 1):
            waiting.append(pid)
    return waiting


def _launchers_running() -> int:
    """The sandboxes this process runs now: its children that run the launcher (the launcher's
    own child has its command line too until it execs the code)."""
    count = 0
    for pid in alive_descendants(os.getpid()):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        count += ppid == os.getpid() and sandbox.LAUNCHER.encode() in args
    return count


def _send_go(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:  # its call ended meanwhile (a timeout): the results say so
            pass


def _text(result) -> str:
    """A call's output, or the message of its error."""
    return str(result) if isinstance(result, Exception) else result[0]


async def _until_waiting(count: int, earlier: set[int], calls: list[asyncio.Future]) -> list[int]:
    """The sandboxes waiting for their go once ``count`` of them are (fewer once every call ended)."""
    deadline = time.monotonic() + 60
    while len(waiting := _sandboxes_waiting(earlier)) < count and not all(c.done() for c in calls):
        assert time.monotonic() < deadline, f"{len(waiting)} of {count} sandboxes waiting after 60 s"
        await asyncio.sleep(0.02)
    return waiting


def test_calls_at_once_each_have_their_own_thread_limit():
    """The issue's report: with 24 calls at once, each starting one thread, 10 to 12 were refused
    ("can't start new thread"), none alone: every sandbox ran as uid 65534 and RLIMIT_NPROC
    counts a uid's tasks over all of them. Here the 24 start their thread only once all 24 run
    (rate_limit lets them); as root each runs as a uid of its own. The limit still holds per sandbox:
    a call beside them that starts threads until refused gets max_processes - 1 of them."""
    tool = PythonTool({"timeout_s": 60, "max_processes": 4, "rate_limit": 25}, None)
    one_thread = WAIT_FOR_GO + "t = threading.Thread(target=print, args=(os.getuid(),))\nt.start()\nt.join()"
    threads_until_refused = WAIT_FOR_GO + """stop, started = threading.Event(), 0
try:
    while started < 10:
        threading.Thread(target=stop.wait).start()
        started += 1
except RuntimeError as err:
    print(started, err)
stop.set()
"""
    earlier = set(alive_descendants(os.getpid()))

    async def calls_at_once():
        calls = [asyncio.ensure_future(tool.execute("i", {"code": code}))
                 for code in [one_thread] * 24 + [threads_until_refused]]
        _send_go(await _until_waiting(25, earlier, calls))
        return await asyncio.gather(*calls, return_exceptions=True)

    *ones, many = asyncio.run(calls_at_once())
    assert [_text(r).splitlines()[-1] for r in ones if isinstance(r, Exception)] == []
    uids = [int(_text(r)) for r in ones]
    if os.geteuid() == 0:
        assert len(set(uids)) == 24 and all(u in SANDBOX_UIDS for u in uids)  # a host uid of its own each
    assert _text(many) == "3 can't start new thread\n"  # max_processes 4: the main thread and 3 more


def test_no_more_than_rate_limit_calls_run_at_once_and_waiting_is_not_timed():
    """rate_limit 2: six calls are started together, and the test holds each pair 1.1 s before
    it sends them their go: the last pair gets its slots after 2.2 s or more of waiting and
    ends after 3.3 s or more, past timeout_s = 3, yet succeeds (a call's own run is its
    start-up and 1.1 s): the timeout starts once a call has its slot. The sandboxes running
    are counted from the host when each pair is waiting and again before its go."""
    tool = PythonTool({"timeout_s": 3, "rate_limit": 2}, None)
    earlier = set(alive_descendants(os.getpid()))

    async def six_calls():
        calls = [asyncio.ensure_future(tool.execute("i", {"code": WAIT_FOR_GO + "print('done')"}))
                 for _ in range(6)]
        running, sent = [], set()
        while waiting := await _until_waiting(2, earlier | sent, calls):
            running.append(_launchers_running())
            await asyncio.sleep(1.1)
            running.append(_launchers_running())
            _send_go(waiting)
            sent.update(waiting)
        return running, await asyncio.gather(*calls, return_exceptions=True)

    running, results = asyncio.run(six_calls())
    assert [_text(r) for r in results] == ["done\n"] * 6
    assert running == [2] * 6  # without the cap all six run from the start


def test_rate_limit_is_read_from_the_tools_yaml_and_defaults_to_the_cores(tmp_path):
    yaml_file = tmp_path / "tools.yaml"
    yaml_file.write_text("tools:\n  - class_name: python\n    config: {type: native, rate_limit: 3}\n")
    assert load_tools(yaml_file)["python"].slots.limit == 3
    assert PythonTool({}, None).slots.limit == len(os.sched_getaffinity(0))
    for bad in (0, 2.5, "4", True):
        with pytest.raises(ValueError, match=f"rate_limit .calls at once. must be an integer >= 1, got {bad!r}"):
            PythonTool({"rate_limit": bad}, None)


def _start_trainer_mid_call():
    trainer = subprocess.Popen([sys.executable, "-c", INTERRUPTED], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert trainer.stdout.readline() == "calling\n"  # the tool's start-up probe (a sandbox too) is over
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sandboxed = alive_descendants(trainer.pid)  # the launcher, then the code
        if len(sandboxed) == 2 and b"\x00-c\x00" in Path(f"/proc/{sandboxed[1]}/cmdline").read_bytes():
            return trainer, sandboxed
        time.sleep(0.05)
    raise AssertionError(f"no sandbox started within 30 s: {sandboxed}")


def _wait_dead(pids, seconds=10):
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


INTERRUPTED = '''
import asyncio, sys
from rlvr.tools.python import PythonTool
tool = PythonTool({"timeout_s": 60, "cpu_time_s": 60}, None)
print("calling", flush=True)
asyncio.run(tool.execute("i", {"code": "import time\\ntime.sleep(60)"}))
'''


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_nothing_outlives_an_interrupted_trainer(how, ctrl_c_raises):
    """Ctrl-C in the middle of a call cancels it (the process group is killed, the mount point
    removed); SIGKILL runs no cleanup, so the parent-death signal ends the sandbox and the next
    tool start removes the empty mount point."""
    trainer, sandboxed = _start_trainer_mid_call()
    trainer.send_signal(how)
    trainer.wait(timeout=30)
    assert _wait_dead(sandboxed)
    left = list(Path(sandbox.tempfile.gettempdir()).glob(f"{sandbox.MOUNT_PREFIX}{trainer.pid}-*"))
    if how == signal.SIGKILL:
        assert len(left) == 1
        sandbox.remove_stale_mount_points()
        left = [p for p in left if p.exists()]
    assert left == []


def test_the_code_dies_with_its_launcher():
    """The launcher killed while the trainer cannot react (stopped): the code must not live on
    with ppid 1. (Switching to uid 65534 clears the parent-death signal; it is set again.)"""
    trainer, (launcher, code) = _start_trainer_mid_call()
    trainer.send_signal(signal.SIGSTOP)
    try:
        os.kill(launcher, signal.SIGKILL)
        assert _wait_dead([code], seconds=5)
    finally:
        trainer.kill()
        trainer.wait(timeout=30)
        if alive(code):
            os.kill(code, signal.SIGKILL)
        sandbox.remove_stale_mount_points()  # the stopped trainer was killed: nothing removed its mount point
