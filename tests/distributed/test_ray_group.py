"""The Ray worker group with fake workers (``ray_group_checks.py``, in a loopback-only network
namespace): ranks and rendezvous address from the environment, colocated roles in one process,
execute_all / execute_rank_zero, DP dispatch with padding, a failing rank named, and a
resource check that refuses what the cluster lacks."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
pytest.importorskip("ray")

sys.path.insert(0, str(Path(__file__).parents[1]))
from loopback_only import loopback_only  # noqa: E402


def test_ray_worker_group_with_fake_workers(tmp_path):
    script = Path(__file__).with_name("ray_group_checks.py")
    done = subprocess.run(loopback_only([sys.executable, str(script), str(tmp_path)]), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "ALL CHECKS PASSED" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
