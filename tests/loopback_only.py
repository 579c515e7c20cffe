"""Run a command where the loopback is the only network interface: ``unshare --user
--map-root-user --net -- python tests/loopback_only.py CMD ...`` (``loopback_only(cmd)`` builds
that line). Ray's gRPC servers listen on every interface of their host whatever node IP they
are given; inside a fresh network namespace the only interface is 127.0.0.1, so the Ray tests
open no port anywhere else."""

import fcntl
import os
import shutil
import socket
import struct
import sys

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def loopback_only(command: list[str]) -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RuntimeError("the Ray tests need util-linux's unshare to run inside a loopback-only network namespace")
    return [unshare, "--user", "--map-root-user", "--net", "--", sys.executable, os.path.abspath(__file__), *command]


def bring_loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


if __name__ == "__main__":
    bring_loopback_up()
    os.execvp(sys.argv[1], sys.argv[1:])
