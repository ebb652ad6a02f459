"""Real multiruns in a subprocess on tiny settings: run folders, one W&B group per sweep, the resolved config in each
run, summary metrics, the comparison report, launchers (joblib, submitit_local), the Optuna preset and a failing job."""

import json
import re

import pytest
import yaml
from PIL import Image

from machina.compare import main as compare
from machina.run_folder.reading import find_run_dirs
from tests.conftest import run_train
from tests.wandb_reader import find_runs, read_run, records

# debug=tiny cut to two epochs of 1,024 agent steps: the first episodes end in the second epoch, so runs have a return.
TINY = ["debug=tiny", "trainer.total_timesteps=2048"]
# Parallel launchers: one torch thread per job, so two jobs share the two cores instead of fighting over them.
PARALLEL = [*TINY, "system.threads=1"]
SUMMARY_KEYS = {
    "summary/final_reward",
    "summary/best_reward",
    "summary/sps_mean",
    "summary/sps_max",
    "summary/agent_steps",
    "summary/wall_time",
}


def summary(run_file) -> dict:
    """The W&B run summary as the offline file holds it: the summary records' updates, applied in order."""
    values = {}
    for record in records(run_file):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values


def compare_rows(directory, capsys) -> list[dict]:
    capsys.readouterr()
    assert compare([str(directory), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def sweep(tmp_path, capsys, args) -> tuple:
    """Run ``train.py -m ARGS`` into tmp_path/sweep, which must succeed; return the folder, process and compare rows."""
    folder = tmp_path / "sweep"
    result = run_train(["-m", *args, f"hydra.sweep.dir={folder}"])
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, result, compare_rows(folder, capsys)


@pytest.mark.slow
def test_two_by_two_sweep_groups_names_tags_config_summary_and_comparison(tmp_path, wandb_dirs, capsys):
    folder, _, rows = sweep(
        tmp_path, capsys, ["losses=[ppo],[ppo,supervisor]", "system.torch_deterministic=true,false", *TINY]
    )

    run_dirs = find_run_dirs(folder)
    assert [d.name.split("_")[0] for d in run_dirs] == ["0", "1", "2", "3"]
    for run_dir in run_dirs:
        # The folder name says the run's overrides and stays a single, shell-safe path component.
        assert len(run_dir.name.encode()) < 255 and not re.search(r"[\s'\"/\\]", run_dir.name)
        assert "trainer.total_timesteps=2048" in run_dir.name
    assert "losses=[ppo,supervisor]" in run_dirs[2].name and "system.torch_deterministic=False" in run_dirs[3].name

    runs = [(run_dir, read_run(find_runs(run_dir / "wandb")[0])) for run_dir in run_dirs]
    assert {run["run"].run_group for _, run in runs} == {"sweep"}
    names = [run["run"].display_name for _, run in runs]
    assert len(set(names)) == 4 and names[0].startswith("0:") and "losses=[ppo]" in names[0]
    for (run_dir, run), multi in zip(runs, [False, False, True, True], strict=True):
        emitted = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
        assert emitted["policy"]["action_probs"]["emit_full_log_probs"] is multi
        assert run["config"]["policy"]["action_probs"]["emit_full_log_probs"] is multi
        tags = set(run["run"].tags)
        assert {"loss:ppo", "policy:fast", "env:machina_1", "experiment:machina_1"} <= tags
        assert ("loss:supervisor" in tags) is multi
        assert run["run"].job_type == ("ppo+supervisor" if multi else "ppo")
    assert [("deterministic:true" in run["run"].tags) for _, run in runs] == [True, False, True, False]
    for run_dir, _ in runs:
        values = summary(find_runs(run_dir / "wandb")[0])
        assert set(values) >= SUMMARY_KEYS and values["summary/agent_steps"] == 2048 and values["summary/sps_max"] > 0

    assert [row["status"] for row in rows] == ["ok"] * 4
    assert [row["agent_steps"] for row in rows] == [2048] * 4 and all(row["sps_mean"] > 0 for row in rows)
    assert rows[3]["overrides"][:2] == ["losses=[ppo,supervisor]", "system.torch_deterministic=False"]
    with Image.open(folder / "compare.png") as image:
        assert image.format == "PNG" and image.size == (800, 320)
    assert compare([str(folder)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("shared overrides: debug=tiny trainer.total_timesteps=2048")
    assert re.search(r"^3 +ok +losses=\[ppo,supervisor\] system.torch_deterministic=False +2 +2048 ", text, re.M)


@pytest.mark.slow
def test_failing_job_is_reported_and_does_not_hide_the_other(tmp_path, capsys):
    folder = tmp_path / "sweep"
    result = run_train(["-m", "experience.batch_size=1000,1024", *TINY, "wandb=disabled", f"hydra.sweep.dir={folder}"])
    # Hydra runs every job, then reports the failed one and exits non-zero.
    assert result.returncode == 1
    assert "Error executing job with overrides: ['experience.batch_size=1000'" in result.stderr
    failed, ok = compare_rows(folder, capsys)
    assert failed["status"] == "failed" and failed["epochs"] == 0
    assert "experience.batch_size=1000 must be a multiple of agents x bptt_horizon" in failed["error"]
    assert ok["status"] == "ok" and ok["agent_steps"] == 2048 and ok["error"] is None


@pytest.mark.slow
def test_joblib_launcher_runs_jobs_in_parallel_processes(tmp_path, wandb_dirs, capsys):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    args = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "losses=[ppo],[ppo,supervisor]", *PARALLEL]
    folder, result, rows = sweep(tmp_path, capsys, args)
    assert "Joblib.Parallel(n_jobs=2" in result.stderr + result.stdout
    assert [row["status"] for row in rows] == ["ok", "ok"]
    assert {read_run(f)["run"].run_group for f in find_runs(folder)} == {"sweep"}


@pytest.mark.slow
def test_submitit_local_launcher(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    args = ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5", "losses=[ppo]", *PARALLEL]
    folder, _, (row,) = sweep(tmp_path, capsys, [*args, "wandb=disabled"])
    assert row["status"] == "ok" and row["agent_steps"] == 2048
    assert any((folder / ".submitit").iterdir())  # submitit's own job logs


@pytest.mark.slow
def test_optuna_preset_maximises_the_chosen_objective(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    args = ["experiment=machina_1_optuna", "hydra.sweeper.n_trials=2", "objective=summary/sps_mean", *TINY]
    folder, _, rows = sweep(tmp_path, capsys, [*args, "wandb=disabled"])
    assert [row["status"] for row in rows] == ["ok", "ok"]
    assert all(any(o.startswith("optimizer.lr=") for o in row["overrides"]) for row in rows)
    # The task function returned summary/sps_mean, so Optuna's best value is the faster trial's mean SPS.
    best = yaml.safe_load((folder / "optimization_results.yaml").read_text())["best_value"]
    assert best == pytest.approx(max(row["sps_mean"] for row in rows))


def test_a_nan_objective_fails_the_job_instead_of_the_optuna_study():
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from machina.startup.sweep_callbacks import NanObjectiveFailsJob

    config = OmegaConf.create({"objective": "summary/final_reward"})
    nan, ok = JobReturn(status=JobStatus.COMPLETED), JobReturn(status=JobStatus.COMPLETED)
    nan.return_value, ok.return_value = float("nan"), 0.5
    for job in (nan, ok):
        NanObjectiveFailsJob().on_job_end(config=config, job_return=job)
    assert ok.status == JobStatus.COMPLETED and ok.return_value == 0.5
    assert nan.status == JobStatus.FAILED
    with pytest.raises(ValueError, match="objective summary/final_reward is NaN"):
        _ = nan.return_value
