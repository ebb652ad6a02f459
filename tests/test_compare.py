"""`python -m machina.compare` on hand-made run folders: statuses, the table, --json and the PNG, with no training."""

import json

import yaml
from PIL import Image

from machina.compare import main, shared_overrides, table
from machina.run_folders import find_run_dirs, read_run

COMMON = ["env.num_envs=16", "trainer.total_timesteps=2048"]


def make_run(folder, overrides, epochs, log="", torn=False):
    """A run folder as train.py leaves it: .hydra/, resolved_config.yaml, train.log and ``epochs`` metric rows."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"trainer": {"total_timesteps": 2048}}))
    job_num = int(folder.name.split("_")[0])
    (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": job_num}}}))
    (folder / "train.log").write_text(log)
    rows = [
        {
            "metric/agent_step": 1024 * (i + 1),
            "metric/epoch": i + 1,
            "overview/sps": 1000.0 * (i + 1),
            "overview/reward": None if i == 0 else 0.5 * i,  # no episode ended in the first epoch
            "timing/epoch": 1.5,
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
    assert (ok.epochs, ok.agent_steps, ok.sps_mean, ok.sps_max) == (2, 2048, 1500.0, 2000.0)
    assert (ok.final_return, ok.best_return, ok.wall_time) == (0.5, 0.5, 3.0)
    assert incomplete.epochs == 1 and incomplete.final_return is None and incomplete.error is None
    assert failed.error == "ConfigError: experience.batch_size=1000 must be ..."


def test_table_shows_what_each_run_changed_and_the_failure(tmp_path):
    runs = [read_run(d) for d in find_run_dirs(make_sweep(tmp_path))]
    assert shared_overrides(runs) == COMMON
    text = table(runs)
    assert text.splitlines()[0] == "shared overrides: env.num_envs=16 trainer.total_timesteps=2048"
    row = next(line for line in text.splitlines() if line.startswith("0 "))
    assert row.split()[:5] == ["0", "ok", "losses=[ppo]", "2", "2048"]
    assert "    failed: ConfigError: experience.batch_size=1000 must be ..." in text
    assert "trainer.total_timesteps" not in "\n".join(text.splitlines()[1:])


def test_cli_json_rows_and_png(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep")
    out = tmp_path / "plots" / "cmp.png"
    assert main([str(sweep), "--json", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["status"] for row in rows] == ["ok", "incomplete", "failed", "ok"]
    assert rows[0]["overrides"] == ["losses=[ppo]", *COMMON] and rows[0]["sps_max"] == 2000.0
    with Image.open(out) as image:
        assert image.format == "PNG" and 600 <= image.width <= 1200 and 250 <= image.height <= 600


def test_default_png_goes_in_the_first_folder_and_an_empty_folder_is_an_error(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep")
    assert main([str(sweep / "0_a")]) == 0
    assert (sweep / "0_a" / "compare.png").is_file()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[2].startswith("0    ok      losses=[ppo] env.num_envs=16")  # no shared line
    assert main([str(tmp_path / "empty")]) == 1
