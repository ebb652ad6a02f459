"""`python -m machina.compare` on hand-made run folders: which folders are runs, statuses, the table, --json and the
PNG, with no training."""

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path

import yaml
from PIL import Image

from machina.compare import collect, legend_label, main, shared_overrides, table
from machina.run_folder.reading import find_run_dirs, read_run
from tests.commands import Result, run_module

COMMON = ["env.num_envs=16", "trainer.total_timesteps=2048"]
LOG_START = "[2026-11-30 01:46:29,231][machina.run][INFO] - run ...\n"


def make_run(folder, overrides, epochs, log="", torn=False, job=None):
    """A run folder as train.py leaves it: .hydra/, train.log and ``epochs`` metric rows. ``job``: its number in a
    sweep (default: the number its folder name starts with); -1 for a single run."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"trainer": {"total_timesteps": 2048}}))
    job = int(folder.name.split("_")[0]) if job is None else job
    mode, num = ("RUN", "???") if job < 0 else ("MULTIRUN", job)
    (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"mode": mode, "job": {"num": num}}}))
    (folder / "train.log").write_text(LOG_START + log)
    rows = [
        {
            "metric/agent_step": 1024 * (i + 1),
            "metric/epoch": i + 1,
            "overview/sps": 1024 / (0.5 * (i + 1)),  # epochs of 0.5 s, 1 s, ...
            "overview/reward": None if i == 0 else 0.5 * i,  # no episode ended in the first epoch
            "timing/epoch": 0.5 * (i + 1),
        }
        for i in range(epochs)
    ]
    text = "".join(json.dumps(row) + "\n" for row in rows)
    (folder / "metrics.jsonl").write_text(text + ('{"metric/agent_st' if torn else ""))


def make_sweep(root):
    make_run(root / "0_a", ["losses=[ppo]", *COMMON], epochs=2)
    make_run(root / "1_b", ["losses=[ppo,supervisor]", *COMMON], epochs=1, torn=True)
    make_run(
        root / "2_c",
        ["experience.batch_size=1000", *COMMON],
        epochs=0,
        log="[2026-11-30 01:46:29,231][machina][ERROR] - ConfigError: experience.batch_size=1000 must be ...\n",
    )
    # Job numbers sort numerically, not as text.
    make_run(root / "10_d", ["losses=[supervisor]", *COMMON], epochs=2)
    return root


def test_statuses_and_numbers_come_from_the_run_folders(tmp_path):
    runs = [read_run(d) for d in find_run_dirs(make_sweep(tmp_path))]
    assert [r.job for r in runs] == ["0", "1", "2", "10"]
    assert [r.status for r in runs] == ["ok", "incomplete", "failed", "ok"]
    ok, incomplete, failed, _ = runs
    # sps: agent steps / the epochs' wall time, not the mean of the epoch rates (1536 steps/s).
    assert (ok.epochs, ok.agent_steps, ok.wall_time, ok.sps_max) == (2, 2048, 1.5, 2048.0)
    assert ok.sps_mean == 2048 / 1.5
    assert (ok.final_return, ok.best_return, ok.started) == (0.5, 0.5, datetime(2026, 11, 30, 1, 46, 29))
    assert incomplete.epochs == 1 and incomplete.final_return is None and incomplete.error is None
    assert failed.error == "ConfigError: experience.batch_size=1000 must be ..."


def test_a_stop_by_a_signal_is_incomplete_not_failed(tmp_path):
    interrupted = "[2026-11-30 01:47:00,000][machina][ERROR] - Interrupted: stopped by SIGINT after epoch 1; ...\n"
    make_run(tmp_path / "run", COMMON, epochs=1, log=interrupted, job=-1)
    nan = "[2026-11-30 01:47:00,000][machina][ERROR] - TrainingStopped: non-finite loss at epoch 2 ...\n"
    make_run(tmp_path / "nan", COMMON, epochs=1, log=nan, job=-1)
    run, stopped = read_run(tmp_path / "run"), read_run(tmp_path / "nan")
    assert (run.status, run.error) == ("incomplete", "Interrupted: stopped by SIGINT after epoch 1; ...")
    assert stopped.status == "failed"


def test_only_training_runs_are_listed(tmp_path, capsys):
    """Of a folder of outputs: single runs with epochs and every sweep job; not eval.py's folders, nor single runs
    that stopped at start-up (unless named)."""
    outputs = tmp_path / "outputs"
    make_run(outputs / "2026-11-30" / "01-46-29", [], epochs=2, job=-1)
    make_run(outputs / "2026-11-30" / "01-50-00", [], epochs=2, job=-1)
    failed_start = outputs / "2026-11-30" / "02-00-00"
    make_run(failed_start, ["trainer.gamma=2"], epochs=0, job=-1, log="[...][machina][ERROR] - ConfigError: ...\n")
    (outputs / "eval" / "2026-11-30" / "03-00-00" / ".hydra").mkdir(parents=True)
    (outputs / "eval" / "2026-11-30" / "03-00-00" / ".hydra" / "config.yaml").write_text("checkpoint: x\n")
    make_sweep(outputs / "multirun" / "sweep")

    runs, folders, skipped = collect([outputs])
    assert skipped == 2
    assert [folders[run.path] for run in runs] == [
        "2026-11-30/01-46-29",
        "2026-11-30/01-50-00",
        "multirun/sweep/0_*",
        "multirun/sweep/1_*",
        "multirun/sweep/2_*",
        "multirun/sweep/10_*",
    ]
    assert [run.job for run in runs] == ["-", "-", "0", "1", "2", "10"]  # a single run has no job number
    assert main([str(failed_start)]) == 0  # named: listed, as failed
    assert "failed: ConfigError: ..." in capsys.readouterr().out


def test_table_shows_what_each_run_changed_when_and_where(tmp_path):
    runs, folders, _ = collect([make_sweep(tmp_path)])
    assert shared_overrides(runs) == COMMON
    text = table(runs, folders)
    lines = text.splitlines()
    assert lines[0] == "shared overrides: env.num_envs=16 trainer.total_timesteps=2048"
    assert re.split(" {2,}", lines[1]) == ["job", "status", "changes", "epochs", "agent steps", "sps", "sps max"] + [
        "final ret",
        "best ret",
        "wall",
        "started",
        "folder",
    ]
    row = next(line for line in lines if line.startswith("0 "))
    assert row.split() == ["0", "ok", "losses=[ppo]", "2", "2048", "1,365", "2,048", "0.500", "0.500", "1.5s"] + [
        "2026-11-30",
        "01:46",
        "0_*",
    ]
    assert "    failed: ConfigError: experience.batch_size=1000 must be ..." in text
    assert "trainer.total_timesteps" not in "\n".join(lines[1:])


def test_cli_json_rows_and_png(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep")
    out = tmp_path / "plots" / "cmp.png"
    assert main([str(sweep), "--json", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["status"] for row in rows] == ["ok", "incomplete", "failed", "ok"]
    assert rows[0]["overrides"] == ["losses=[ppo]", *COMMON] and rows[0]["sps_max"] == 2048.0
    assert (rows[0]["folder"], rows[0]["started"]) == ("0_*", "2026-11-30 01:46:29")
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (800, 320)


def test_default_png_goes_in_the_first_folder_and_an_empty_folder_is_an_error(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep")
    assert main([str(sweep / "0_a")]) == 0
    assert (sweep / "0_a" / "compare.png").is_file()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[2].startswith("0    ok      losses=[ppo] env.num_envs=16")  # no shared line
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2


def test_legend_labels_break_between_overrides_never_inside_one():
    label = legend_label("3: losses=[ppo,sliced_scripted_cloner] system.torch_deterministic=False trainer.gamma=0.9")
    assert label.splitlines() == [
        "3: losses=[ppo,sliced_scripted_cloner]",
        "system.torch_deterministic=False",
        "trainer.gamma=0.9",
    ]


def run_cli(module: str, *args) -> Result:
    """``python -m module ARGS`` as a user types it, run in this process (``tests.commands``)."""
    return run_module(module, *map(str, args))


def hashes(folder) -> dict[str, str]:
    """sha256 of every file under ``folder``, by relative path: what a command must not have changed."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def assert_one_line_error(result, *words):
    """Exit code 2 and exactly one line on stderr that holds each of ``words``; no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def make_damaged_sweep(root):
    """Two good jobs around jobs damaged in every way a disk, a kill or a careless edit damages a run folder."""
    make_run(root / "0_a", ["losses=[ppo]", *COMMON], epochs=2)
    make_run(root / "1_b", ["losses=[b]", *COMMON], epochs=2)
    (root / "1_b" / ".hydra" / "config.yaml").write_text("trainer: [total_timesteps: 2048\n")  # not YAML
    make_run(root / "2_c", ["losses=[c]", *COMMON], epochs=2)
    (root / "2_c" / ".hydra" / "overrides.yaml").write_text("losses: c\n")  # a mapping, not the list of overrides
    make_run(root / "3_d", ["losses=[d]", *COMMON], epochs=2)
    (root / "3_d" / "metrics.jsonl").unlink()
    (root / "3_d" / "metrics.jsonl").mkdir()
    make_run(root / "4_e", ["losses=[e]", *COMMON], epochs=2)
    good = (root / "4_e" / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (root / "4_e" / "metrics.jsonl").write_bytes(good[0] + b"\xff\xfe{garbage\n" + b"[1, 2]\n" + good[1])
    make_run(root / "5_f", ["losses=[f]", *COMMON], epochs=2)
    rows = [json.loads(line) for line in (root / "5_f" / "metrics.jsonl").read_text().splitlines()]
    del rows[0]["overview/sps"], rows[1]["metric/agent_step"]
    rows[1]["timing/epoch"] = "slow"
    (root / "5_f" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    make_run(root / "6_g", ["losses=[g]", *COMMON], epochs=2)
    (root / "6_g" / "resolved_config.yaml").write_text("- trainer\n")  # a list, not a mapping
    (root / "6_g" / ".hydra" / "hydra.yaml").write_bytes(b"hydra: {job: \xff\n")  # invalid UTF-8 and unclosed
    make_run(root / "10_h", ["losses=[supervisor]", *COMMON], epochs=2)
    return root


def test_damaged_folders_are_rows_of_their_own_and_hide_none_of_the_others(tmp_path):
    sweep = make_damaged_sweep(tmp_path / "sweep")
    before = hashes(tmp_path)
    result = run_cli("machina.compare", sweep, "--json", "--out", tmp_path / "cmp.png")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows = {Path(row["path"]).name: row for row in map(json.loads, result.stdout.splitlines())}
    assert list(rows) == ["0_a", "1_b", "2_c", "3_d", "4_e", "5_f", "6_g", "10_h"]
    assert {name: row["status"] for name, row in rows.items()} == {
        "0_a": "ok",
        "1_b": "damaged",
        "2_c": "damaged",
        "3_d": "damaged",
        "4_e": "ok",  # two bad lines skipped, the row after them still counts
        "5_f": "incomplete",  # its last agent step is lost with the column: 1024 of 2048
        "6_g": "damaged",
        "10_h": "ok",
    }
    for good in ("0_a", "10_h"):
        assert (rows[good]["epochs"], rows[good]["agent_steps"], rows[good]["sps_max"]) == (2, 2048, 2048.0)
        assert rows[good]["warnings"] == [] and rows[good]["error"] is None
    assert rows["1_b"]["error"].startswith(".hydra/config.yaml: not valid YAML")
    assert rows["2_c"]["error"] == ".hydra/overrides.yaml: holds a mapping, not a list"
    assert rows["2_c"]["overrides"] is None and rows["2_c"]["epochs"] == 2  # the metrics are still read
    assert (
        rows["3_d"]["error"]
        == f"{sweep / '3_d' / 'metrics.jsonl'}: is a folder, not a regular file; only regular files are read"
    )
    assert (rows["4_e"]["epochs"], rows["4_e"]["agent_steps"]) == (2, 2048)
    assert rows["4_e"]["warnings"] == ["metrics.jsonl line 2: invalid UTF-8", "metrics.jsonl line 3: not a JSON object"]
    assert (rows["5_f"]["agent_steps"], rows["5_f"]["sps_max"], rows["5_f"]["wall_time"]) == (1024, 1024.0, 0.5)
    assert rows["5_f"]["warnings"] == [
        "metrics.jsonl: 1 of 2 rows without metric/agent_step",
        "metrics.jsonl: 1 of 2 rows without overview/sps",
        "metrics.jsonl: 1 of 2 rows without timing/epoch",
    ]
    assert rows["6_g"]["error"].startswith(".hydra/hydra.yaml: not valid YAML")  # the first damage; the others follow
    assert rows["6_g"]["warnings"][0] == "resolved_config.yaml: holds a list, not a mapping"
    assert rows["6_g"]["job"] == "-"  # which job it was is in the damaged hydra.yaml
    assert hashes(tmp_path) == {**before, "cmp.png": hashes(tmp_path)["cmp.png"]}

    runs, folders, _ = collect([sweep])
    text = table(runs, folders)
    assert "    damaged: .hydra/overrides.yaml: holds a mapping, not a list" in text
    assert "    warning: metrics.jsonl line 3: not a JSON object" in text
    changed = next(line for line in text.splitlines() if line.startswith("2 "))
    assert changed.split()[:3] == ["2", "damaged", "?"]  # its overrides are unknown, not "(defaults)"


def test_a_damaged_single_run_is_listed_named_or_found_under_a_folder(tmp_path, capsys):
    """A single run with no epoch is left out unless named, but one whose files are damaged is always shown."""
    outputs = tmp_path / "outputs"
    make_run(outputs / "good", COMMON, epochs=2, job=-1)
    make_run(outputs / "no_metrics", COMMON, epochs=0, job=-1)
    (outputs / "no_metrics" / "metrics.jsonl").unlink()
    (outputs / "no_metrics" / "metrics.jsonl").mkdir()
    make_run(outputs / "bad_config", COMMON, epochs=2, job=-1)
    (outputs / "bad_config" / ".hydra" / "config.yaml").write_text("- not\n- a mapping\n")
    runs, folders, skipped = collect([outputs])
    assert skipped == 0
    assert {folders[run.path]: run.status for run in runs} == {
        "bad_config": "damaged",
        "good": "ok",
        "no_metrics": "damaged",
    }
    assert main([str(outputs / "bad_config"), "--out", str(tmp_path / "cmp.png")]) == 0
    assert "    damaged: .hydra/config.yaml: holds a list, not a mapping" in capsys.readouterr().out


def test_command_line_errors_are_one_line_exit_2_and_write_nothing(tmp_path):
    sweep = make_sweep(tmp_path / "sweep")
    (tmp_path / "a_file").write_text("not a folder\n")
    before = hashes(tmp_path)
    assert_one_line_error(run_cli("machina.compare", sweep, tmp_path / "missing"), "no such folder", "missing")
    assert_one_line_error(run_cli("machina.compare", tmp_path / "a_file"), "a_file", "not a folder")
    assert_one_line_error(run_cli("machina.compare", sweep, "--bogus"), "--bogus")
    assert_one_line_error(run_cli("machina.compare", sweep, "--out", tmp_path / "cmp.txt"), "cmp.txt", ".png")
    # Where the picture cannot be written: a folder in its place, a file where its folder should be.
    assert_one_line_error(
        run_cli("machina.compare", sweep, "--out", tmp_path / "a_file" / "cmp.png"), "a_file/cmp.png", "--out"
    )
    (sweep / "compare.png").mkdir()
    assert_one_line_error(run_cli("machina.compare", sweep), f"cannot write {sweep / 'compare.png'}", "--out PATH")
    assert hashes(tmp_path) == before
