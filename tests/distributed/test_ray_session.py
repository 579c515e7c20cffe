"""The local Ray rlvr starts leaves nothing in /tmp: ``RaySession.shutdown`` removes the
``rlvr-ray-*`` folder this process made (and no other run's), and keeps Ray's logs in the run
folder at the path that reached them while Ray ran. ``ray`` is a stand-in that writes what
``ray.init`` writes into its ``_temp_dir`` (a session folder with logs, ``session_latest``);
``ray_group_checks.py`` checks the same with a real Ray."""

import tempfile
from pathlib import Path

import pytest
import ray  # noqa: F401 (installed by make test: a missing Ray fails here, never skips)

import rlvr.distributed.ray_workers as ray_workers

SESSION = "session_2026-11-29_12-00-00_000000_1"


class StandInRay:
    """What ``ray.init`` leaves in its temp folder, with no Ray started."""

    def __init__(self, fail: bool = False):
        self.up, self.fail = False, fail

    def is_initialized(self) -> bool:
        return self.up

    def init(self, **kwargs) -> None:
        logs = Path(kwargs["_temp_dir"]) / SESSION / "logs"
        logs.mkdir(parents=True)
        (logs / "raylet.out").write_text("raylet started\n")
        (Path(kwargs["_temp_dir"]) / "session_latest").symlink_to(logs.parent, target_is_directory=True)
        if self.fail:
            raise ConnectionError("the GCS did not start")
        self.up = True

    def shutdown(self, wait_for_processes: bool = False) -> None:
        self.up = False


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    """/tmp for this test: where ``tempfile.mkdtemp`` makes the ``rlvr-ray-*`` folders."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_shutdown_removes_this_runs_ray_folder_and_no_other_keeping_the_logs(tmp_root, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_workers, "ray", StandInRay())
    other = Path(tempfile.mkdtemp(prefix="rlvr-ray-"))  # another run's, maybe live
    (other / SESSION / "logs").mkdir(parents=True)
    (other / SESSION / "logs" / "raylet.out").write_text("the other run's raylet\n")
    run_dir = tmp_path / "run"
    session = ray_workers.init_ray(None, 2, run_dir)
    (mine,) = set(tmp_root.glob("rlvr-ray-*")) - {other}
    assert session.temp_dir == mine
    live = run_dir / "ray" / "session_latest" / "logs" / "raylet.out"
    assert live.read_text() == "raylet started\n"  # reachable from the run folder while Ray runs

    session.shutdown()
    assert not mine.exists()
    assert (other / SESSION / "logs" / "raylet.out").read_text() == "the other run's raylet\n"
    assert live.read_text() == "raylet started\n"  # at the same path, with Ray's folder gone
    assert (run_dir / "ray" / SESSION / "logs" / "raylet.out").is_file()
    session.shutdown()  # a second shutdown removes nothing more
    assert other.exists()


def test_a_resumed_run_keeps_the_earlier_runs_ray_logs_beside_its_own(tmp_root, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setattr(ray_workers, "ray", StandInRay())
    ray_workers.init_ray(None, 2, run_dir).shutdown()
    (run_dir / "ray" / SESSION).rename(run_dir / "ray" / "session_earlier")  # its own date in life
    monkeypatch.setattr(ray_workers, "ray", StandInRay())
    ray_workers.init_ray(None, 2, run_dir).shutdown()
    assert (run_dir / "ray" / "session_earlier" / "logs" / "raylet.out").is_file()
    assert (run_dir / "ray" / "session_latest").resolve() == (run_dir / "ray" / SESSION).resolve()
    assert list(tmp_root.iterdir()) == []


def test_a_ray_that_fails_to_start_leaves_no_folder(tmp_root, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_workers, "ray", StandInRay(fail=True))
    with pytest.raises(ConnectionError, match="the GCS did not start"):
        ray_workers.init_ray(None, 2, tmp_path / "run")
    assert list(tmp_root.iterdir()) == []
    assert (tmp_path / "run" / "ray" / "session_latest" / "logs" / "raylet.out").is_file()  # why it failed


def test_a_temp_dir_named_in_ray_init_is_the_users_and_is_kept(tmp_root, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_workers, "ray", StandInRay())
    theirs = tmp_path / "their-ray"
    session = ray_workers.init_ray(None, 2, tmp_path / "run", kwargs={"_temp_dir": str(theirs)})
    assert list(tmp_root.iterdir()) == []  # rlvr made no folder of its own
    session.shutdown()
    assert (theirs / SESSION / "logs" / "raylet.out").is_file()
