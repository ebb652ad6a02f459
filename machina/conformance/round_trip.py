"""``check_round_trip``: a config made of a user's parts, trained, interrupted, resumed and evaluated as
``train.py`` and ``eval.py`` do it. One use, in a user's own tests::

    check_round_trip(["hydra.searchpath=[pkg://my_lab.conf]", "env=my_env", "policy=my_policy"], tmp_path)
"""

import json
import math
import signal
import subprocess
import sys
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import torch
from omegaconf import DictConfig

from machina.conformance.config import compose
from machina.conformance.failure import ConformanceError
from machina.env.base import Resumable
from machina.errors import ConfigError, Interrupted, one_line
from machina.files import metrics_file
from machina.files.trusted import MACHINA_CONF
from machina.logging.sink import Sink
from machina.run import train
from machina.startup.build import build_env_factory
from machina.training.checkpoint import checkpoints

EVAL = MACHINA_CONF.parent / "eval.py"
# Exact reruns (system.torch_deterministic) and a checkpoint only where the kit asks for one.
SETTINGS = ("system.torch_deterministic=true", "trainer.checkpoint_interval=0", "trainer.eval_interval=0")
STOP = f"+logger.conformance_stop._target_={__name__}.StopAfterFirstEpoch"
# Metrics of the clock, not of the run: they differ between any two runs.
CLOCK = ("timing/", "overview/sps")


class StopAfterFirstEpoch(Sink):
    """A sink that sends the process SIGINT once the first epoch is logged, as a user's Ctrl-C: the trainer finishes
    the epoch, checkpoints it and stops (``Interrupted``)."""

    def log(self, metrics: dict[str, float]) -> None:
        if metrics["metric/epoch"] == 1:
            signal.raise_signal(signal.SIGINT)


def check_round_trip(overrides: Sequence[str], folder: str | Path, epochs: int = 2) -> None:
    """Raise ``ConformanceError`` (one sentence: what to implement) unless the run ``overrides`` describe (composed
    over machina's ``conf/`` at ``debug=tiny`` sizes with ``system.torch_deterministic=true``) resumes exactly.

    In ``folder``: ``whole/`` trains ``epochs`` epochs uninterrupted; ``resumed/`` is stopped by SIGINT after its
    first epoch (checkpointed), then resumed by the same command to ``epochs``: every metric of every epoch but the
    clock's (``timing/*``, ``overview/sps*``) must be bit-identical to ``whole/``'s. An env that cannot restore its
    live episodes (``continues_episodes`` false: a resume starts new ones) is held to that for the epoch before the
    stop only; after it, the resumed run must log every epoch. Then ``eval.py`` evaluates ``resumed/`` (two episodes,
    no replay) and must write ``eval.json``. ``train`` runs in this process; ``eval.py`` in a child process::

        check_round_trip(["hydra.searchpath=[pkg://my_lab.conf]", "env=my_env", "policy=my_policy"], tmp_path)
    """
    folder = Path(folder)
    cfg = compose(overrides)
    size = cfg.experience.batch_size
    exact = restores_episodes(cfg)
    run = [*overrides, *SETTINGS, f"trainer.total_timesteps={epochs * size}"]
    whole, resumed = folder / "whole", folder / "resumed"
    trained("an uninterrupted run", run, whole)
    try:
        trained("a run stopped after its first epoch", [*run, STOP], resumed)
    except Interrupted:
        pass
    else:
        raise ConformanceError("the run was not stopped by SIGINT after its first epoch: train in the main thread")
    if not checkpoints(resumed / "checkpoints"):
        raise ConformanceError("a run stopped by SIGINT wrote no checkpoint: the trainer must checkpoint on a stop")
    trained("the resumed run", run, resumed)
    compare(rows(whole), rows(resumed), epochs if exact else 1)
    evaluate(overrides, resumed, folder / "eval")


def restores_episodes(cfg: DictConfig) -> bool:
    """Whether the run's env restores its live episodes from a checkpoint (``Resumable`` with
    ``continues_episodes``): only then does a resumed run continue bit-exactly. Asked of one env built as the run
    builds it."""
    with closing(build_env_factory(cfg.env, torch.device("cpu"))(seed=0, num_envs=1, stagger=False)) as env:
        return isinstance(env, Resumable) and env.continues_episodes


def trained(what: str, overrides: list[str], run_dir: Path) -> None:
    """``train.py``'s run of ``overrides`` in ``run_dir``, in this process; a refusal as what to implement."""
    try:
        train(compose(overrides), run_dir)
    except ConfigError as err:
        raise ConformanceError(f"{what} is refused ({one_line(err)}): fix what the message names") from None


def rows(run_dir: Path) -> dict[int, dict]:
    """The run's metrics rows by epoch (``metrics.jsonl``; a resume's rows continue the file)."""
    found, _ = metrics_file.read_rows(run_dir / metrics_file.NAME)
    return {int(row["metric/epoch"]): row for row in found}


def compare(whole: dict[int, dict], resumed: dict[int, dict], exact: int) -> None:
    """The resumed run logged the uninterrupted run's epochs, and the metrics (but the clock's) of its first
    ``exact`` epochs equal the uninterrupted run's, bit for bit."""
    if sorted(resumed) != sorted(whole):
        raise ConformanceError(
            f"the resumed run logged epochs {sorted(resumed)}, not {sorted(whole)}: a resume must continue after its "
            "checkpoint's epoch"
        )
    for epoch in range(1, exact + 1):
        for name in sorted(set(whole[epoch]) | set(resumed[epoch])):
            if name.startswith(CLOCK):
                continue
            want, got = whole[epoch].get(name), resumed[epoch].get(name)
            if not same(want, got):
                raise ConformanceError(
                    f"after a resume, {name} of epoch {epoch} is {got!r} where the uninterrupted run has {want!r}: "
                    "every part must save in its state_dict all it carries between epochs (env, losses, rollout "
                    "state) and restore it exactly"
                )


def same(a: object, b: object) -> bool:
    """Equal numbers, NaN (a metric without a value, null in metrics.jsonl) equal to itself."""
    nothing = (None,) if a is None or b is None else ()
    if nothing or not (isinstance(a, float) and isinstance(b, float)):
        return a == b
    return a == b or (math.isnan(a) and math.isnan(b))


def evaluate(overrides: Sequence[str], run_dir: Path, out_dir: Path) -> None:
    """``python eval.py checkpoint=<run_dir>``: two episodes of the run's env rebuilt from its folder."""
    search_path = [o for o in overrides if o.startswith("hydra.searchpath=")]
    command = [sys.executable, str(EVAL), f"checkpoint={run_dir}", "episodes=2", "replay=false", *search_path]
    result = subprocess.run(
        [*command, f"hydra.run.dir={out_dir}"], cwd=MACHINA_CONF.parent, capture_output=True, text=True, timeout=600
    )
    output = (result.stdout + result.stderr).strip().splitlines()
    if result.returncode != 0:
        last = output[-1] if output else f"exit code {result.returncode}"
        raise ConformanceError(
            f"eval.py cannot evaluate the resumed run ({one_line(last)}): its env must be rebuilt from the run folder"
        )
    report = json.loads((out_dir / "eval.json").read_text())
    if report.get("policy", {}).get("episodes") != 2:
        raise ConformanceError("eval.py's eval.json does not report the policy's 2 episodes: report each episode")
