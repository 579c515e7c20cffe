"""What the python tool's sandbox costs per call, against starting the same interpreter bare.

    .venv/bin/python bench/sandbox.py [--calls 30]

Both run ``print(sum(range(1000)))`` with the base interpreter in isolated mode; the bare
reference is ``python -I -S -c CODE`` started the same way (asyncio subprocess, output to a
file). The sandbox adds the namespaces, the mounts, the privilege drop, the seccomp filter and
a second interpreter start (stage 1 sets up, stage 2 runs the code). Prints the median and the
ratio sandbox / bare, interleaving the two so that machine drift hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time

from rlvr.tools.python import PYTHON, SandboxLimits, run_sandboxed
from runs import at_least

CODE = "print(sum(range(1000)))"


async def bare() -> str:
    with tempfile.TemporaryFile() as out:
        proc = await asyncio.create_subprocess_exec(PYTHON, "-I", "-S", "-c", CODE, stdin=subprocess.DEVNULL,
                                                    stdout=out, start_new_session=True)
        await proc.wait()
        out.seek(0)
        return out.read().decode()


async def sandboxed() -> str:
    return (await run_sandboxed(CODE, SandboxLimits())).stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=at_least(1), default=30)
    args = parser.parse_args()
    times = {"bare": [], "sandbox": []}
    for _ in range(args.calls):
        for name, fn in (("bare", bare), ("sandbox", sandboxed)):
            start = time.perf_counter()
            assert asyncio.run(fn()) == "499500\n"
            times[name].append(time.perf_counter() - start)
    bare_ms, sandbox_ms = (1000 * statistics.median(times[k]) for k in ("bare", "sandbox"))
    print(f"median of {args.calls} calls: bare interpreter {bare_ms:.1f} ms | sandbox {sandbox_ms:.1f} ms | "
          f"ratio sandbox / bare {sandbox_ms / bare_ms:.2f}")


if __name__ == "__main__":
    main()
