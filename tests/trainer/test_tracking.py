"""Tracking backends and plots: TensorBoard events and a W&B offline run hold the step metrics;
`rlvr plot` writes the expected panels."""

import json
import time

import pytest

from rlvr.cli import main
from rlvr.trainer.plot import PANELS
from rlvr.trainer.tracking import Tracking, console_line


def test_console_line():
    line = console_line({"critic/score/mean": 0.25, "timing_s/step": 3.14, "val-core/arithmetic/reward/mean@1": 0.5}, 7)
    assert line == "step 7 | reward 0.250 | step_s 3.1 | arithmetic/reward/mean@1 0.500"
    # what went wrong is on the line when it happened, and only then
    line = console_line({"critic/score/mean": 0.25, "reward/num_invalid": 9.0, "training/dropped_groups": 3.0,
                         "reward/num_errors": 0.0}, 8)
    assert line == "step 8 | reward 0.250 | invalid rewards 9 | dropped groups 3"


def test_tensorboard_events_hold_the_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracking(["tensorboard"], tmp_path)
    for step in (1, 2):
        tracker.log({"critic/score/mean": 0.1 * step, "actor/pg_loss": -0.5}, step)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("critic/score/mean")] == [(1, 0.1), (2, 0.2)]
    assert "actor/pg_loss" in events.Tags()["scalars"]


def test_wandb_offline_run_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = Tracking(["wandb"], tmp_path, project="rlvr-test", experiment="offline", config={"a": 1})
    tracker.log({"critic/score/mean": 0.75}, 1)
    tracker.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    history = list(runs[0].glob("*.wandb"))
    assert history
    deadline = time.time() + 60  # wandb's service process may finish writing just after finish() returns
    while b"critic/score/mean" not in history[0].read_bytes() and time.time() < deadline:
        time.sleep(0.5)
    assert b"critic/score/mean" in history[0].read_bytes()


def test_unknown_backend_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown backends \\['mlflow'\\]"):
        Tracking(["mlflow"], tmp_path)


def test_plot_writes_the_panels(tmp_path, capsys):
    from PIL import Image

    records = [{"step": 0, "val-core/arithmetic/reward/mean@1": 0.37}]
    records += [{"step": s, "critic/score/mean": 0.1 * s, "response_length/mean": 30 - s, "actor/kl_loss": 0.01 * s,
                 "actor/entropy": 1.0 / s, "timing_s/step": 20.0} for s in range(1, 5)]
    records[-1]["val-core/arithmetic/reward/mean@1"] = 0.5
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["plot", str(tmp_path)]) == 0
    assert "curves.png" in capsys.readouterr().out
    for name in [*PANELS, "curves"]:
        image = Image.open(tmp_path / "plots" / f"{name}.png")
        assert image.size[0] >= 400 and image.size[1] >= 300
    assert main(["plot", str(tmp_path / "missing")]) == 2


def test_rewind_drops_a_torn_last_line_and_later_records(tmp_path):
    """kill -9 mid-write leaves half a line; the resumed run must not crash on it."""
    lines = [json.dumps({"step": s, "critic/score/mean": s / 10}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "critic/sco')
    tracker = Tracking(["jsonl"], tmp_path)
    tracker.rewind(2)
    tracker.log({"critic/score/mean": 0.9}, 3)
    tracker.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["critic/score/mean"] == 0.9
    (tmp_path / "metrics.jsonl").write_text(lines[0] + "\nnot json\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a JSON record"):
        Tracking(["jsonl"], tmp_path).rewind(2)


@pytest.mark.parametrize("bad", ['[1, 2]', '{"critic/score/mean": 0.5}', '{"step": "2"}'])
def test_a_line_that_is_no_metrics_record_is_named_on_resume_and_plot(tmp_path, capsys, bad):
    """Valid JSON that is not a record with an integer step (an edited file, another tool's line):
    the resume's rewind raised a bare KeyError/TypeError, and rlvr plot a traceback. Counted as the
    editor does: the blank line 2 is counted, the bad line is line 3."""
    from rlvr.cli import main

    good = [json.dumps({"step": s, "critic/score/mean": s / 10}) for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text(good[0] + "\n\n" + bad + "\n" + good[1] + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 3: not a metrics record \(a JSON object with an "
                                         r"integer 'step'\)"):
        Tracking(["jsonl"], tmp_path).rewind(2)
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "line 3: not a metrics record" in err and "Traceback" not in err


def test_tensorboard_rewind_purges_later_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracking(["tensorboard"], tmp_path)
    for step in (1, 2, 3):
        tracker.log({"critic/score/mean": 0.1 * step}, step)
    tracker.close()
    resumed = Tracking(["tensorboard"], tmp_path)
    resumed.rewind(1)  # resumed from the step-1 checkpoint: steps 2 and 3 are logged again
    for step in (2, 3):
        resumed.log({"critic/score/mean": 0.5 * step}, step)
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("critic/score/mean")] == [(1, 0.1), (2, 1.0), (3, 1.5)]


def test_wandb_resume_rewinds_the_saved_run(tmp_path, monkeypatch):
    """Online: the saved run is rewound to the checkpoint's step (W&B's resume_from); offline
    (which W&B cannot rewind): a new run, said on the console."""
    import sys
    import types

    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        return types.SimpleNamespace(id=f"run{len(calls)}", log=lambda *a, **k: None, finish=lambda: None)

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Settings=lambda **k: None))
    monkeypatch.setenv("WANDB_MODE", "online")
    first = Tracking(["wandb"], tmp_path)
    first.log({"critic/score/mean": 0.5}, 1)
    first.close()
    assert "resume_from" not in calls[0] and (tmp_path / "wandb_run_id.txt").read_text() == "run1"
    resumed = Tracking(["wandb"], tmp_path)
    resumed.rewind(3)
    resumed.close()
    assert calls[1]["resume_from"] == "run1?_step=3"
    monkeypatch.setenv("WANDB_MODE", "offline")
    offline = Tracking(["wandb"], tmp_path)
    offline.rewind(3)
    offline.close()
    assert "resume_from" not in calls[2]


@pytest.fixture
def fake_wandb(tmp_path, monkeypatch):
    """A stub wandb module recording each init call (with the WANDB_MODE it saw), in a HOME of
    its own: no real credentials or settings of the machine running the tests take part."""
    import sys
    import types

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_CONFIG_DIR",
                "NETRC"):
        monkeypatch.delenv(var, raising=False)
    calls = []

    def init(**kwargs):
        import os

        calls.append({**kwargs, "env_mode": os.environ.get("WANDB_MODE")})
        return types.SimpleNamespace(id="run1", log=lambda *a, **k: None, finish=lambda: None)

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Settings=lambda **kw: kw))
    return home, calls


def _wandb_mode(tmp_path, calls):
    tracker = Tracking(["wandb"], tmp_path / "run")
    tracker.log({"critic/score/mean": 0.5}, 1)
    tracker.close()
    return calls[-1].get("mode"), calls[-1]["env_mode"]


def test_wandb_online_for_a_user_who_ran_wandb_login(tmp_path, fake_wandb, monkeypatch):
    from rlvr.trainer.tracking import wandb_credentials

    home, calls = fake_wandb
    assert wandb_credentials() is None
    assert _wandb_mode(tmp_path, calls) == ("offline", None)  # no key anywhere: an offline run, said on the console
    # `wandb login` writes the key into ~/.netrc: wandb finds it, and so must rlvr (no forced offline)
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_credentials() == str(home / ".netrc")
    assert _wandb_mode(tmp_path, calls) == (None, None)
    # a netrc entry for another host does not count when WANDB_BASE_URL names a server of one's own
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    assert _wandb_mode(tmp_path, calls) == ("offline", None)
    netrc = tmp_path / "other_netrc"
    netrc.write_text("machine wandb.example.com login user password " + "j" * 40 + "\n")
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_credentials() == str(netrc) and _wandb_mode(tmp_path, calls) == (None, None)


def test_wandb_key_from_settings_or_environment_and_mode_left_to_the_user(tmp_path, fake_wandb, monkeypatch):
    from rlvr.trainer.tracking import wandb_credentials

    home, calls = fake_wandb
    settings = home / ".config" / "wandb" / "settings"
    settings.parent.mkdir(parents=True)
    settings.write_text("[default]\napi_key = " + "s" * 40 + "\n")
    assert wandb_credentials() == "wandb settings" and _wandb_mode(tmp_path, calls) == (None, None)
    settings.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "e" * 40)
    assert wandb_credentials() == "WANDB_API_KEY" and _wandb_mode(tmp_path, calls) == (None, None)
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "online")  # the user's own choice is wandb's to honour, never overridden
    assert _wandb_mode(tmp_path, calls) == (None, "online")
