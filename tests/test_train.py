"""End-to-end training: a real `python train.py` subprocess, its run folder, metrics.jsonl and offline W&B run
(finished, interrupted and resumed); what the user reads (messages, exit codes, the progress line, the resume
command, the run summary); and the rule that a rollout step makes no host-device sync."""

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import wandb
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import open_dict

from machina.cli import report_errors, resume_command
from machina.env.machina_1 import Machina1Env
from machina.logging.identity import run_identity
from machina.logging.sinks import ConsoleSink
from machina.run import train
from machina.speed.host_reads import count_host_reads
from machina.startup.build import build, build_trainer
from machina.training import experience as experience_module
from machina.training.epoch_metrics import summarize
from machina.training.trainer import Trainer
from tests.commands import run_script
from tests.conftest import compose_config, interrupt_train, run_train
from tests.test_checkpoint import teacher  # noqa: F401 (a fixture: a policy file for eer_kickstarter)
from tests.wandb_reader import find_runs, read_run

# The tiny run every test builds on: the recipe shrunk by debug=tiny (conf/debug/tiny.yaml), 3 epochs of 1,024 agent
# steps. Every preset has one: [f"experiment={name}", *TINY] (tests/test_presets.py).
TINY = ["debug=tiny"]


def test_debug_tiny_is_a_seconds_long_run_of_the_recipe_and_experiment_debug_is_the_same_but_its_curriculum():
    debug, recipe = compose_config(TINY), compose_config([])
    assert debug.trainer.total_timesteps == 3 * debug.experience.batch_size == 3072
    assert debug.env.num_envs * debug.env.agents_per_env * debug.experience.bptt_horizon == 1024
    assert debug.losses == recipe.losses and debug.policy == recipe.policy  # only sizes change
    assert debug.optimizer == recipe.optimizer and debug.trainer.curriculum == recipe.trainer.curriculum
    # The quick start's spelling: the same run, without the main job's map-size curriculum (written for
    # env=machina_1 only, experiments/env/machina_1_machina_1.yaml), so that it checks any env.
    quick = compose_config(["experiment=debug"])
    assert len(debug.trainer.curriculum) == 2 and list(quick.trainer.curriculum) == []
    quick.trainer.curriculum = debug.trainer.curriculum
    assert quick == debug


def test_the_main_jobs_curriculum_comes_with_its_env_only():
    """experiments/env/<experiment>_<env>.yaml applies to that pair only: the main job on another env, or another
    preset on machina_1, composes without the machina_1 curriculum, and the main job's other settings stay."""
    main = compose_config([])
    assert [stage["env"]["region_size"] for stage in main.trainer.curriculum] == [7, 9]
    for overrides in (["env=gymnasium"], ["env=mettagrid"], ["experiment=machina_1_dagger"]):
        other = compose_config(overrides)
        assert list(other.trainer.curriculum) == [], overrides
    assert compose_config(["env=gymnasium"]).optimizer.lr == main.optimizer.lr == 0.0024


@pytest.mark.slow  # a train.py process with a W&B service; the wandb sink conforms in test_conformance.py
def test_train_writes_metrics_jsonl_and_an_offline_wandb_run(tmp_path, wandb_dirs):
    run_dir = tmp_path / "run"
    result = run_train(["experiment=debug", f"hydra.run.dir={run_dir}"])  # the quick start's first command
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["metric/epoch"] for r in rows] == [1, 2, 3]
    assert [r["metric/agent_step"] for r in rows] == [1024, 2048, 3072]
    for row in rows:
        assert row["overview/sps"] > 0 and row["overview/sps_cumulative"] > 0
        assert "losses/ppo/loss_policy" in row and "losses/ppo/approx_kl" in row
        assert row["timing/rollout.env"] > 0 and 0 < row["timing/train.backward_frac"] < 1
        assert "overview/reward" in row and "env/hearts_deposited" in row
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert "epoch     3 | steps 3.07k/3.07k" in (run_dir / "train.log").read_text()

    (run_file,) = find_runs(run_dir / "wandb")
    run = read_run(run_file)
    history = run["history"]
    assert len(history) == 3
    assert [h["metric/agent_step"] for h in history] == [1024, 2048, 3072]
    assert all(h["overview/sps"] > 0 for h in history)
    assert run["config"]["policy"]["action_probs"]["emit_full_log_probs"] is False
    assert "loss:ppo" in list(run["run"].tags) and "deterministic:false" in list(run["run"].tags)
    assert run["run"].display_name == f"{tmp_path.name}/run"  # no overrides but experiment: the folder
    assert run["exit_code"] == 0 and run["summary"]["summary/status"] == "finished"


def test_bad_setting_exits_with_a_message_not_a_traceback(tmp_path):
    """In this process (tests.commands); test_preflight.py runs the real script for its exit code."""
    result = run_script("train.py", *TINY, "experience.batch_size=1000", f"hydra.run.dir={tmp_path}", "wandb=disabled")
    assert result.returncode == 2
    assert "experience.batch_size=1000 must be a multiple of agents x bptt_horizon" in result.output
    assert "Traceback" not in result.output


def test_unknown_group_option_is_reported(tmp_path):
    result = run_script("train.py", "policy=nope", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 2
    assert (
        "ConfigError: policy=nope: 'nope' is not an option of group policy; options: conv, fast, mlp, vit"
        in result.output
    )
    assert not (tmp_path / "run").exists()


class Picky:
    """Test-only target: refuses every value, as a constructor refuses a bad setting."""

    def __init__(self, size: int):
        raise ValueError(f"size={size} is too big")


def test_a_constructor_error_is_reported_alone(caplog):
    """Hydra wraps a constructor's ValueError in an InstantiationException; the message shows the constructor's
    words and the config node, not Hydra's wrapper text."""
    with caplog.at_level(logging.ERROR, "machina"), pytest.raises(SystemExit) as stop, report_errors():
        instantiate({"model": {"part": {"_target_": f"{__name__}.Picky", "size": 7}}})
    assert stop.value.code == 2
    assert caplog.messages == ["ConfigError: size=7 is too big (building model.part)"]


@pytest.fixture
def hydra_run():
    """``hydra_run(overrides, output_dir, mode)`` makes ``HydraConfig`` describe that run, as @hydra.main does;
    the fixture clears it again (other tests run without Hydra)."""

    def describe(overrides, output_dir, mode=RunMode.RUN):
        cfg = compose_config(overrides, return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.mode = mode
            cfg.hydra.runtime.output_dir = str(output_dir)
            cfg.hydra.sweep.dir = "outputs/multirun/sweep"
            cfg.hydra.job.num = 3
        HydraConfig.instance().set_config(cfg)
        return cfg

    yield describe
    HydraConfig.instance().cfg = None


def test_the_resume_command_fixes_the_run_folder(hydra_run):
    hydra_run(["learner.advantage.gamma=0.9"], "/runs/2026-11-30/12-00-00")
    argv = ["train.py", "losses=[ppo,supervisor]", "hydra.run.dir=elsewhere", "learner.advantage.gamma=0.9"]
    assert resume_command(argv) == (
        "python train.py 'losses=[ppo,supervisor]' learner.advantage.gamma=0.9 hydra.run.dir=/runs/2026-11-30/12-00-00"
    )
    hydra_run(["learner.advantage.gamma=0.9"], "/runs/sweep/0_x", RunMode.MULTIRUN)
    sweep = os.path.abspath("outputs/multirun/sweep")
    assert resume_command(["train.py", "-m", "learner.advantage.gamma=0.9,0.99"]) == (
        f"python train.py -m learner.advantage.gamma=0.9,0.99 hydra.sweep.dir={sweep}"
    )


def test_run_names_tell_runs_apart(hydra_run):
    cfg = hydra_run([], "/runs/2026-11-30/12-00-00")
    assert run_identity(cfg)["name"] == "2026-11-30/12-00-00"  # not "default"
    cfg = hydra_run(["learner.advantage.gamma=0.9"], "/runs/2026-11-30/12-00-01")
    assert run_identity(cfg)["name"] == "2026-11-30/12-00-01:learner.advantage.gamma=0.9"
    assert run_identity(cfg)["group"] is None  # a single run is in no sweep
    cfg = hydra_run(["learner.advantage.gamma=0.9"], "/runs/sweep/3_learner.advantage.gamma=0.9", RunMode.MULTIRUN)
    assert run_identity(cfg) == {
        "name": "3:learner.advantage.gamma=0.9",
        "group": "sweep",
        "tags": ["loss:ppo", "experiment:machina_1", "env:machina_1", "policy:fast", "deterministic:false"],
        "job_type": "ppo",
    }


def test_a_runs_identity_is_its_own_and_wandb_settings_change_only_the_wandb_run(hydra_run):
    cfg = hydra_run(["wandb.group=ablation", "wandb.tags=[mine]"], "/runs/sweep/3_x", RunMode.MULTIRUN)
    identity = run_identity(cfg)
    assert identity["group"] == "sweep" and "mine" not in identity["tags"]


def test_the_summary_sps_is_agent_steps_over_training_time():
    history = [
        {"metric/agent_step": 1000, "overview/sps": 1000.0, "overview/reward": float("nan")},
        {"metric/agent_step": 2000, "overview/sps": 100.0, "overview/reward": 0.5},  # a slow epoch: 10 s
        {"metric/agent_step": 3000, "overview/sps": 1000.0, "overview/reward": 0.25},
    ]
    summary = summarize(history)
    assert summary["summary/wall_time"] == pytest.approx(12.0)
    assert summary["summary/sps_mean"] == pytest.approx(3000 / 12)  # the mean of the epoch rates would be 700
    assert summary["summary/sps_max"] == 1000.0 and summary["summary/agent_steps"] == 3000
    assert (summary["summary/final_reward"], summary["summary/best_reward"]) == (0.25, 0.5)
    assert summarize([])["summary/agent_steps"] == 0  # stopped before its first epoch


def test_the_progress_line_counts_to_the_last_whole_epoch(caplog):
    sink = ConsoleSink(total_timesteps=2500)
    with caplog.at_level(logging.INFO, "machina.logging.sinks"):
        for epoch in (1, 2):
            step = 1024 * epoch
            sink.log(
                {
                    "metric/agent_step": step,
                    "metric/epoch": epoch,
                    "overview/sps": 512.0,
                    "overview/sps_cumulative": 512.0,
                    "overview/reward": float("nan"),
                }
            )
    note, first, second = caplog.messages
    assert (
        note
        == "runs stop at whole epochs of 1,024 agent steps: this one stops at 3,072 (trainer.total_timesteps=2,500)"
    )
    assert "steps 1.02k/3.07k" in first and "eta 0m04s" in first
    assert "steps 2.05k/3.07k" in second and "eta 0m02s" in second


def test_an_interrupted_run_is_not_finished_in_wandb(tmp_path, wandb_dirs, monkeypatch):
    """Ctrl-C in epoch 1: W&B's exit code is 130, the run is marked preempting (resumable), and the summary says
    what was reached; the logged config shows the run's group."""
    step, calls = Machina1Env.step, []

    def step_and_interrupt(self, actions):
        calls.append(1)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGINT)  # handled before it returns: two are never merged into one
        return step(self, actions)

    monkeypatch.setattr(Machina1Env, "step", step_and_interrupt)
    cfg = compose_config([*TINY, "wandb.group=ablation"])
    with pytest.raises(SystemExit) as stop, report_errors():
        train(cfg, tmp_path)
    assert stop.value.code == 130
    wandb.teardown()  # the W&B service writes the run's last records when it stops (a process exit stops it)
    (run_file,) = find_runs(tmp_path / "wandb")
    run = read_run(run_file)
    assert run["exit_code"] == 130 and "preempting" in run["kinds"]
    assert run["summary"]["summary/status"] == "interrupted" and run["summary"]["summary/agent_steps"] == 1024
    assert run["config"]["wandb"]["group"] == "ablation"


@pytest.mark.slow
def test_ctrl_c_prints_the_command_that_resumes_into_the_same_wandb_run(tmp_path, wandb_dirs):
    """A real Ctrl-C (SIGINT) of `python train.py`: exit 130, a resume command with this run's folder; running that
    command continues the run (the next epochs, the same W&B run id)."""
    run_dir = tmp_path / "outputs" / "first"
    args = [*TINY, "trainer.total_timesteps=1000000", "trainer.checkpoint_interval=0"]
    metrics_file = run_dir / "metrics.jsonl"
    code, output, command = interrupt_train(
        [*args, f"hydra.run.dir={run_dir}"], lambda: metrics_file.is_file() and metrics_file.read_text(), tmp_path
    )
    assert code == 130, output[-3000:]
    assert command.startswith("python ") and command.endswith(f"hydra.run.dir={run_dir}")
    stopped_at = len((run_dir / "metrics.jsonl").read_text().splitlines())

    _, *args = shlex.split(command)
    resumed = subprocess.run(
        [sys.executable, *args, f"trainer.total_timesteps={1024 * (stopped_at + 1)}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["metric/epoch"] for r in rows] == list(range(1, stopped_at + 2))
    first, second = (read_run(f)["run"] for f in find_runs(run_dir / "wandb"))
    assert first.run_id == second.run_id


def make_trainer(overrides) -> Trainer:
    """The parts and trainer as machina.run builds them, without the run folder and sinks."""
    cfg = compose_config([*TINY, *overrides])
    return build_trainer(cfg, build(cfg), sinks=[])


# The line of the epoch's one host read in training (the compacted token width).
WIDTH_LINE = next(
    number
    for number, line in enumerate(Path(experience_module.__file__).read_text().splitlines(), 1)
    if "the epoch's one host read" in line
)


@pytest.mark.parametrize("sampler", ["sequential", "prioritized"])
@pytest.mark.parametrize(
    "losses", ["[ppo]", "[ppo,supervisor]", "[sliced_scripted_cloner,ppo]", "[ppo,eer_cloner]", "[ppo,eer_kickstarter]"]
)
def test_rollout_and_update_make_no_host_sync(losses, sampler, request):
    """Every loss and both samplers: no Python-level host read (item, tolist, cpu, numpy, bool, float, int, index)
    in a rollout step or a minibatch."""
    teacher_file = []
    if "kickstarter" in losses:
        teacher_file = [f"losses.eer_kickstarter.teacher.path={request.getfixturevalue('teacher')}"]
    trainer = make_trainer([f"losses={losses}", f"experience/sampler={sampler}", *teacher_file])
    syncs: list[str] = []
    with count_host_reads(syncs):
        steps = trainer.rollout.run(trainer.progress)
    assert steps == trainer.learner.experience.batch_size
    assert syncs == []  # env, policy, rollout hooks, buffer writes: no host read of a tensor
    with count_host_reads(syncs):
        trainer.learner.prepare()
    # One per epoch before the minibatches, the width of the compacted token observations...
    assert len(syncs) == 1 and syncs[0].startswith("__int__ at ") and syncs[0].endswith(f"experience.py:{WIDTH_LINE}")
    with count_host_reads(syncs := []):
        trainer.learner.update(trainer.progress)
    assert trainer.learner.experience.num_minibatches > 1 and syncs == []  # ...and none in the update's minibatches
