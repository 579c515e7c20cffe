"""The python tool's sandbox, enforced by the kernel. Standard library only: this file runs
as a script (``python -I -S sandbox_launch.py SPEC``), never imported by rlvr's code.

Stage 1 (``launch``), started by the trainer's user:

- sets a parent-death signal, so it dies with the trainer;
- unshares mount, PID, network, IPC and UTS namespaces (and a user namespace when the
  trainer is not root: the code then runs as uid 65534 inside, the trainer's uid outside);
- forks the namespace's PID 1, which builds a new root: a read-only tmpfs holding read-only
  binds of ``/usr``, the library folders and the interpreter's prefix, five device nodes, its
  own ``/proc``, and ``/sandbox``, a size-limited tmpfs that is the only writable place;
  pivots into it and detaches the old root, so nothing else of the host is visible
  (home folders, the training data, the venv, other processes);
- drops every capability (bounding set included), switches to the spec's uid (one no other
  running sandbox holds, so ``RLIMIT_NPROC`` counts this sandbox's tasks alone) and gid 65534
  when it started as root (so the code is unprivileged inside and outside), sets
  no-new-privileges and the resource limits, and execs stage 2.

Stage 2 (``run``) installs a seccomp filter (no new processes, no exec, no ptrace, no
mount/unshare/setns/pivot_root, no kernel keyring, bpf, perf or module calls) and runs
``/sandbox/main.py``. When PID 1 exits the kernel kills everything left in the namespace, and
the tmpfs goes with the last process that held it.
"""

import ctypes
import json
import os
import platform
import resource
import signal
import struct
import sys
import traceback

SANDBOX_ID = 65534  # nobody: the gid, and the uid inside a user namespace
WORKDIR = "/sandbox"
LIB_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")
DEVICES = ("null", "zero", "full", "random", "urandom")

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_THREAD = 0x00010000
NAMESPACE_FLAGS = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET \
    | 0x02000000 | 0x00000080  # CLONE_NEWCGROUP, CLONE_NEWTIME
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
ST_RELATIME = 4096  # statvfs reports relatime with another bit than mount(2) takes
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 24, 38, 22
SECCOMP_MODE_FILTER = 2

# Per architecture: the audit arch value, then the syscall numbers the filter refuses.
SYSCALLS = {
    "x86_64": (0xC000003E, dict(
        clone=56, clone3=435, fork=57, vfork=58, execve=59, execveat=322, ptrace=101, process_vm_readv=310,
        process_vm_writev=311, mount=165, umount2=166, pivot_root=155, chroot=161, unshare=272, setns=308,
        open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
        bpf=321, perf_event_open=298, keyctl=250, add_key=248, request_key=249, userfaultfd=323,
        init_module=175, finit_module=313, delete_module=176, kexec_load=246, io_uring_setup=425)),
    "aarch64": (0xC00000B7, dict(
        clone=220, clone3=435, execve=221, execveat=281, ptrace=117, process_vm_readv=270, process_vm_writev=271,
        mount=40, umount2=39, pivot_root=41, chroot=51, unshare=97, setns=268, open_tree=428, move_mount=429,
        fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, bpf=280, perf_event_open=241,
        keyctl=219, add_key=217, request_key=218, userfaultfd=282, init_module=105, finit_module=273,
        delete_module=106, kexec_load=104, io_uring_setup=425)),
}
SYSCALLS["arm64"] = SYSCALLS["aarch64"]

libc = ctypes.CDLL(None, use_errno=True)


def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sandbox: {what}: {os.strerror(err)}")


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          f"mount {source or fstype} on {target}")


def bind(source, target, read_only=True):
    """A bind mount of ``source`` at ``target``, read-only unless asked (keeping the flags the
    kernel does not let a namespace clear)."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        held = os.statvfs(source).f_flag
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (held & (MS_NODEV | MS_NOEXEC | MS_NOATIME
                                                                        | MS_NODIRATIME))
        mount(None, target, None, flags | (MS_RELATIME if held & ST_RELATIME else 0))


def build_root(root, spec):
    """Mount the sandbox's file system at ``root`` (an empty folder) and pivot into it."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in (*LIB_DIRS, *ETC_FILES, *spec["binds"]):
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.exists(path) and not os.path.exists(root + path):
            bind(path, root + path)
    for name in DEVICES:
        bind(f"/dev/{name}", f"{root}/dev/{name}", read_only=False)
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + WORKDIR)
    mount("tmpfs", root + WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={spec['disk_mb']}m,nr_inodes={spec['max_files']},mode=0700,uid={spec['uid']},gid={SANDBOX_ID}")
    os.symlink(WORKDIR, root + "/tmp")
    with open(f"{root}{WORKDIR}/main.py", "wb") as f:
        f.write(spec["code"].encode("utf-8", "backslashreplace"))
    os.chown(f"{root}{WORKDIR}/main.py", spec["uid"], SANDBOX_ID)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    check(libc.syscall(SYSCALLS[platform.machine()][1]["pivot_root"], b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir(WORKDIR)


def drop_privileges(spec):
    """No capability survives (the exec of stage 2 clears what uid 65534 still holds in a user
    namespace), no setuid binary can give one back, and the limits are set."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    if spec["as_root"]:
        os.setgroups([])
        os.setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        # A change of uid clears the parent-death signal: set it again, or the code would outlive
        # a launcher killed before it could kill its group.
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    mb = 1024 * 1024
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails instead of killing
    resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_time_s"], spec["cpu_time_s"] + 1))
    for res, value in ((resource.RLIMIT_AS, spec["memory_mb"] * mb), (resource.RLIMIT_NPROC, spec["nproc"]),
                       (resource.RLIMIT_FSIZE, spec["max_file_mb"] * mb),
                       (resource.RLIMIT_NOFILE, spec["max_open_files"]), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))


def enter_namespaces(spec):
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    if spec["as_root"]:  # real root sets the mounts up, then becomes the spec's uid on the host
        check(libc.unshare(flags), "unshare")
        return
    uid, gid = os.getuid(), os.getgid()
    check(libc.unshare(flags | CLONE_NEWUSER), "unshare (user namespaces)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{spec['uid']} {uid} 1"),
                       ("gid_map", f"{SANDBOX_ID} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def launch(spec):
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    if os.getppid() != spec["parent"]:
        sys.exit("sandbox: the trainer exited before the sandbox started")
    spec["code"] = sys.stdin.buffer.read().decode("utf-8", "backslashreplace")
    enter_namespaces(spec)
    pid = os.fork()
    if pid == 0:  # PID 1 of the new namespace
        try:
            check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
            build_root(spec["root"], spec)
            drop_privileges(spec)
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.execve(spec["python"], [spec["python"], "-I", "-S", "-c", spec["source"], "run"], spec["env"])
        except BaseException as err:  # noqa: BLE001 — reported to the trainer, never run the code
            os.write(2, f"sandbox setup failed: {err}\n".encode())
            os._exit(125)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    sys.exit(os.waitstatus_to_exitcode(status))


def seccomp_filter():
    """A classic BPF program: refuse (EPERM) the listed calls and every clone that is not a
    thread or that asks for a namespace; clone3 answers ENOSYS so the C library falls back to
    clone for threads; another architecture's calls kill the process."""
    arch, nr = SYSCALLS[platform.machine()]
    ld_abs, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, kill, eperm, enosys = 0x7FFF0000, 0x80000000, 0x00050000 | 1, 0x00050000 | 38
    ins = lambda code, k, jt=0, jf=0: struct.pack("HBBI", code, jt, jf, k)
    prog = [ins(ld_abs, 4), ins(jeq, arch, 1, 0), ins(ret, kill), ins(ld_abs, 0)]
    if arch == SYSCALLS["x86_64"][0]:
        prog += [ins(0x35, 0x40000000, 0, 1), ins(ret, eperm)]  # jge: the x32 ABI's numbers
    prog += [ins(jeq, nr["clone"], 0, 5), ins(ld_abs, 16),  # the low word of clone's flags
             ins(jset, NAMESPACE_FLAGS, 2, 0), ins(jset, CLONE_THREAD, 0, 1), ins(ret, allow), ins(ret, eperm)]
    prog += [ins(jeq, nr["clone3"], 0, 1), ins(ret, enosys)]
    for name, number in nr.items():
        if name not in ("clone", "clone3"):
            prog += [ins(jeq, number, 0, 1), ins(ret, eperm)]
    prog.append(ins(ret, allow))
    return b"".join(prog)


def run():
    """Stage 2: from here on the kernel refuses what the filter lists."""
    program = seccomp_filter()

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Fprog(len(program) // 8, program)), 0, 0),
          "seccomp")

    def cpu_limit(signum, frame):
        raise TimeoutError("sandbox: the CPU time limit was reached")

    signal.signal(signal.SIGXCPU, cpu_limit)  # the soft limit; the hard limit one second later kills
    with open("main.py") as f:
        code = compile(f.read(), "main.py", "exec")
    sys.argv = ["main.py"]
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 — the traceback from main.py down, as python main.py prints it
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "main.py":
            tb = tb.tb_next
        traceback.print_exception(type(err), err, tb)
        sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run()
    else:
        spec = json.loads(sys.argv[2])
        with open(__file__) as f:
            spec["source"] = f.read()
        launch(spec)
