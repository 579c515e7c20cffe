"""The bench scripts refuse bad arguments while parsing them (argparse's usage error, exit status 2),
before any model loads or run starts, and keep or refuse an earlier run's folder up front.

Each script is loaded from bench/ as a module (bench/ on sys.path, as when it runs as a script);
only its argument parsing or folder check runs here: no model, no training.
"""

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def bench(monkeypatch):
    """Load a bench script (``bench/NAME.py``) as a module."""
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their shared helpers: `from runs import ...`

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


REFUSED = [  # (script, argv, what the error names)
    ("same_run", ["--modes", "sync,async2"], "'async2' is not one of sync, async0, async1"),
    ("same_run", ["--steps", "0"], "below the minimum, 1"),
    ("distributed", ["--modes", "local,ray4"], "'ray4' is not one of"),
    ("distributed", ["--steps", "1"], "below the minimum, 2"),  # the first step is left out of the medians
    ("async", ["--modes", "sync,fast"], "'fast' is not a mode"),
    ("async", ["--modes", "pool-x"], "'pool-x' is not a mode"),
    ("async", ["--stpes", "4"], "unrecognized arguments: --stpes"),
    ("async", ["trainer.device"], "unrecognized arguments: trainer.device"),
    ("async", ["--steps", "1"], "below the minimum, 2"),
    ("rollout", ["--prompt-set", "arithmetic,poems"], "'poems' is not one of arithmetic, open, tools"),
    ("rollout", ["--dtypes", "float16"], "'float16' is not one of float32, bfloat16"),
    ("rollout", ["--shared-ab", "--no-shared-prompts"], "--shared-ab"),
    ("rollout", ["--shared-ab", "--no-lean"], "--shared-ab"),
    ("rollout", ["--repeats", "0"], "below the minimum, 1"),
    ("rollout", ["--n", "two"], "'two' is not an integer"),
    ("distill", ["--runs", "grpo,sft"], "'sft' is not one of grpo, distill, distill_term"),
    ("distill", ["trainer.test_freq=3"], "this script sets trainer.test_freq itself"),
    ("distill", ["+trainer.total_training_steps=5"], "--steps"),
    ("distill", ["--runs", "grpo", "--teacher", "/tmp/t"], "--teacher"),
    ("weight_sync", ["--models", "builtin,7b"], "'7b' is not one of builtin, 0.36b"),
    ("weight_sync", ["--repeats", "0"], "below the minimum, 1"),
    ("weight_sync", ["--bucket-mb", "256,0"], "below the minimum, 1"),
    ("weight_sync", ["--servers", "--receivers", "2"], "--receivers and --bucket-mb do not apply"),
    ("rewards", ["--workers", "0"], "below the minimum, 1"),
    ("rewards", ["--repeats", "0"], "below the minimum, 1"),
]


@pytest.mark.parametrize("script, argv, message", REFUSED, ids=[f"{s} {' '.join(a)}" for s, a, _ in REFUSED])
def test_bad_arguments_are_a_usage_error(bench, capsys, script, argv, message):
    with pytest.raises(SystemExit) as refused:
        bench(script).parse_args(argv)
    assert refused.value.code == 2
    assert message in capsys.readouterr().err


def test_good_arguments_pass(bench):
    args, overrides = bench("async").parse_args(["--modes", "sync,1,pool-sync,pool-2", "trainer.device=cpu",
                                                  "~trainer.logger", "--steps", "3"])
    assert (args.modes, args.steps) == (["sync", "1", "pool-sync", "pool-2"], 3)
    assert overrides == ["trainer.device=cpu", "~trainer.logger"]  # passed through to every mode
    assert bench("distill").parse_args(["data.train_batch_size=4"]).overrides == ["data.train_batch_size=4"]
    assert bench("rollout").parse_args(["--shared-ab"]).prompt_set == ["arithmetic", "open"]  # the default, parsed
    assert bench("weight_sync").parse_args(["--servers", "--models", "0.36b"]).models == ["0.36b"]
    assert bench("same_run").parse_args([]).modes == ["sync", "async0", "async1"]


def write_run(folder: Path, steps: int, tail: str = "") -> Path:
    folder.mkdir()
    rows = [json.dumps({"step": s, "actor/pg_loss": 0.1 * s, "timing_s/step": 1.0}) for s in range(1, steps + 1)]
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n" + tail)
    return folder


def test_same_run_keeps_a_complete_run_and_refuses_any_other(bench, tmp_path):
    same_run = bench("same_run")
    assert same_run.kept(write_run(tmp_path / "complete", 3), 3)
    assert not same_run.kept(tmp_path / "missing", 3)  # to run
    (tmp_path / "empty").mkdir()
    assert not same_run.kept(tmp_path / "empty", 3)
    for folder in (write_run(tmp_path / "interrupted", 2), write_run(tmp_path / "longer", 4),
                   write_run(tmp_path / "cut_short", 2, tail='{"step": 3, "actor/pg')):
        with pytest.raises(SystemExit) as refused:
            same_run.kept(folder, 3)
        assert str(folder) in str(refused.value.code)


def test_same_run_refuses_an_earlier_run_before_running_anything(bench, tmp_path, monkeypatch):
    same_run = bench("same_run")
    write_run(tmp_path / "sync_quiet", 3)  # kept
    write_run(tmp_path / "async0_loaded", 1)  # an interrupted run of the second mode

    def no_run(*args, **kwargs):
        raise AssertionError("a run started before every folder was checked")
    monkeypatch.setattr(same_run, "run_job", no_run)
    with pytest.raises(SystemExit) as refused:
        same_run.main(["--modes", "sync,async0", "--steps", "3", "--out", str(tmp_path)])
    assert str(tmp_path / "async0_loaded") in str(refused.value.code)
