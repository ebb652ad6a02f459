"""The epoch loop: rollout, update, then one device read to log the epoch's metrics."""

import logging
import math
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from machina import checks
from machina.env.base import Resumable
from machina.errors import ConfigError, EnvFailed, Interrupted, TrainingStopped
from machina.files import saved_state
from machina.files.saved_state import within
from machina.logging.sink import Sink
from machina.progress import Progress
from machina.training import distributed
from machina.training.checkpoint import Checkpointer
from machina.training.curriculum import Curriculum
from machina.training.epoch_metrics import episode_metrics, summarize
from machina.training.learner import Learner
from machina.training.periodic_eval import PeriodicEval
from machina.training.rollout import Rollout
from machina.training.stop_signals import StopSignals

log = logging.getLogger(__name__)

# What the run summary reads from each epoch's metrics (kept in ``Trainer.history`` and in checkpoints).
SUMMARY_KEYS = ("metric/agent_step", "overview/reward", "overview/sps")
# 1.0 when every policy parameter is finite: read with the epoch's metrics, never logged.
PARAMS_FINITE = "params_finite"


class Trainer:
    """Trains the policy until ``total_timesteps`` agent steps: epochs of ``rollout`` then ``learner``.

    Per epoch it logs (to every sink) ``metric/agent_step``, ``metric/epoch``, ``overview/sps`` (agent steps of the
    epoch / wall time of the whole epoch), ``overview/sps_cumulative``, ``overview/reward`` (mean return of the
    episodes that ended in the epoch), ``timing/<phase>`` seconds and ``timing/<phase>_frac`` fractions,
    ``losses/<loss>/<metric>``, ``env/<stat>`` and ``experience/<stat>``. Under torchrun, agent steps and SPS count
    every rank's steps, and the other metrics are reduced over the ranks (``epoch_metrics``); timings are this rank's.

    Args:
        total_timesteps: agent steps to train for, summed over the ranks under torchrun.
        rollout, learner: the two phases of an epoch, built by ``machina.startup.build`` (they hold the env, policy,
            losses, buffer and optimizer).
        checkpoint_interval: epochs between checkpoints; 0 checkpoints only at the end (and on a stop signal).
        keep_checkpoints: how many training checkpoints to keep (policy files are all kept).
        eval_interval: epochs between evaluations on held-out layouts (``eval/*`` metrics); 0 turns them off.
        replay_interval: epochs between replay GIFs in the run folder (and every sink's ``log_media``); 0 turns
            them off.
        sinks: where each epoch's metrics go (``machina.logging.sink``): ``machina.run`` hands over the run's
            ``Sinks``, which it opens once the run is accepted; iterated at every epoch.
        checkpointer: a ``Checkpointer``; None writes no checkpoints (tests, benchmarks).
        evaluator: a ``PeriodicEval`` used at ``eval_interval`` / ``replay_interval``; None evaluates nothing.
        curriculum: env settings scheduled over training (``curriculum.py``); empty: the env as built throughout.
            With stages, every epoch also logs ``curriculum/stage`` (the stage its rollout ran in).
        between_epochs: called before each epoch's rollout (``System.adapt_threads``: torch's threads for the
            machine's load); None calls nothing.

    Stops: a non-finite loss or parameter raises ``TrainingStopped`` at the end of its epoch, before that epoch is
    logged or checkpointed, so the last good checkpoint is the newest (``Checkpointer.save`` also refuses to write
    state that a part reports as not good: ``problems``). SIGINT (Ctrl-C) or SIGTERM (preemption) lets the
    current epoch finish, checkpoints it and raises ``Interrupted``; a second SIGINT abandons the epoch at once (the
    last checkpoint, if any, is kept) and a second SIGTERM kills the process.
    """

    def __init__(
        self,
        total_timesteps: int,
        rollout: Rollout,
        learner: Learner,
        checkpoint_interval: int = 0,
        keep_checkpoints: int = 3,
        eval_interval: int = 0,
        replay_interval: int = 0,
        sinks: Iterable[Sink] = (),
        checkpointer: Checkpointer | None = None,
        evaluator: PeriodicEval | None = None,
        curriculum: Sequence[Mapping] = (),
        between_epochs: Callable[[], None] | None = None,
    ):
        for name, value, low in (
            ("total_timesteps", total_timesteps, 1),
            ("checkpoint_interval", checkpoint_interval, 0),
            ("keep_checkpoints", keep_checkpoints, 1),
            ("eval_interval", eval_interval, 0),
            ("replay_interval", replay_interval, 0),
        ):
            checks.integer(f"trainer.{name}", value, low)
        self.total_timesteps = total_timesteps
        self.rollout, self.learner = rollout, learner
        self.checkpoint_interval, self.eval_interval = checkpoint_interval, eval_interval
        self.replay_interval, self.evaluator = replay_interval, evaluator
        self.keep_checkpoints, self.checkpointer = keep_checkpoints, checkpointer
        self.sinks = sinks
        self.curriculum = Curriculum(curriculum, rollout.env) if curriculum else None
        self.between_epochs = between_epochs
        self.agent_step = 0
        self.epoch = 0
        # Per-epoch SUMMARY_KEYS only: small enough to checkpoint, so the run summary spans resumes.
        self.history: list[dict[str, float]] = []

    def state_dict(self) -> dict:
        """What every rank shares: counters, the summary history, the policy's own (training) weights and the
        learner's state (optimizer, weight average). A snapshot: later training does not change it."""
        return {
            "epoch": self.epoch,
            "agent_step": self.agent_step,
            "history": list(self.history),
            "policy": {name: value.detach().clone() for name, value in self.learner.policy.state_dict().items()},
            "learner": self.learner.state_dict(),
        }

    def load_state_dict(self, saved: dict) -> None:
        """Restore a ``state_dict`` whose types ``checkpoint_schema`` checked. Every entry is restored on its own
        (none reads what another wrote), so the order does not matter; each is checked first: every history row
        must hold the ``SUMMARY_KEYS`` the run summary reads, the policy's weights must be this policy's names,
        shapes and dtypes, finite (a ConfigError names the entry)."""
        for index, row in enumerate(saved["history"]):
            missing = [key for key in SUMMARY_KEYS if key not in row]
            if missing:
                raise ConfigError(f"history[{index}] lacks {', '.join(missing)}")
        policy = self.learner.policy
        policy.load_state_dict(saved_state.like(saved["policy"], policy.state_dict(), "policy"))
        with within("learner."):
            self.learner.load_state_dict(saved["learner"])
        self.epoch, self.agent_step = saved["epoch"], saved["agent_step"]
        self.history = list(saved["history"])

    def problems(self) -> list[str]:
        """Why this rank's state is not good to resume from (each part's own report: the learner's); empty when it
        is. ``_save`` hands them to ``Checkpointer.save``, which refuses to write when any rank has one."""
        return self.learner.problems()

    def local_state_dict(self) -> dict:
        """What each rank owns: its envs, its rollout (live observation, recurrent state) and its losses' rollout
        state (``Loss.get_extra_state``)."""
        return {
            "env": self.rollout.env.state_dict() if isinstance(self.rollout.env, Resumable) else {},
            "rollout": self.rollout.state_dict(),
            "losses": {name: loss.state_dict() for name, loss in self.learner.losses.items()},
        }

    def load_local_state_dict(self, saved: dict) -> None:
        """Restore a rank's state; a loss enabled since the checkpoint was taken starts fresh. Each part checks what
        it restores; a ConfigError names the entry (``env.pos``)."""
        env = self.rollout.env
        if isinstance(env, Resumable):
            with within("env."):
                env.load_state_dict(saved["env"])
        else:
            log.warning(
                "%s has no resumable state (machina.env.base.Resumable): its episodes start anew", type(env).__name__
            )
        with within("rollout."):
            self.rollout.load_state_dict(saved["rollout"])
        for name, loss in self.learner.losses.items():
            if name in saved["losses"]:
                with within(f"losses.{name}."):
                    loss.load_state_dict(saved["losses"][name])

    @property
    def progress(self) -> Progress:
        return Progress(self.agent_step, self.total_timesteps)

    def train(self) -> dict[str, float]:
        """Run epochs until ``total_timesteps``; return the summary (final/best reward, SPS, steps, time).

        ``overview/sps_cumulative`` counts the steps and time of this process only, so it stays honest after a
        resume (the checkpoint's steps were not taken in this process's time).
        """
        start = time.perf_counter()
        start_step = self.agent_step
        epoch_start = start
        saved_epoch = self.epoch  # a fresh run or a resume starts at a checkpointed (or initial) state
        with StopSignals() as stop:
            try:
                while self.agent_step < self.total_timesteps:
                    steps = self.run_epoch()
                    now = time.perf_counter()
                    sps_cumulative = (self.agent_step - start_step) / (now - start)
                    metrics = self.epoch_metrics(steps, now - epoch_start, sps_cumulative)
                    epoch_start = now
                    self._check_finite(metrics)
                    metrics.update(self._evaluate())
                    epoch_start = time.perf_counter()  # evaluation is timed apart: it costs no training SPS
                    self._log(metrics)
                    self.history.append({key: metrics[key] for key in SUMMARY_KEYS})
                    # A signal may reach the ranks in different epochs: all of them stop after the same one.
                    signum = distributed.agree_max(stop.signum)
                    if signum or (self.checkpoint_interval and self.epoch % self.checkpoint_interval == 0):
                        saved_epoch = self._save()
                    if signum and self.agent_step < self.total_timesteps:
                        raise Interrupted(
                            f"stopped by {signal.Signals(signum).name} after epoch {self.epoch}; {self._after_stop()}",
                            signum,
                        )
                if saved_epoch != self.epoch:
                    self._save()
            except EnvFailed as err:
                # The policy and optimizer are those of the last finished epoch: checkpoint them (the env's engine,
                # whose episodes are lost, starts new ones on resume), so nothing trained is lost.
                if saved_epoch != self.epoch:
                    self._save()
                raise EnvFailed(f"{err}; stopped in epoch {self.epoch + 1}: {self._after_stop()}") from None
            except KeyboardInterrupt:
                raise Interrupted(
                    f"interrupted twice at agent step {self.agent_step}: the unfinished epoch is not checkpointed; "
                    f"{self._after_stop()}",
                    signal.SIGINT,
                ) from None
        return summarize(self.history)

    def run_epoch(self) -> int:
        """One epoch (rollout, then update) without its metrics read; return the agent steps taken (all ranks).
        ``train`` runs these; benchmarks time them."""
        self.learner.policy.eval()
        # The epoch's schedules (learning rate, loss coefficients) are those of where it starts, in the rollout and
        # in the update: the first epoch trains at the full learning rate (CleanRL's frac = 1 - (iteration - 1) / N).
        progress = self.progress
        if self.between_epochs is not None:
            self.between_epochs()
        if self.curriculum is not None:
            self.curriculum.apply(progress.agent_step)
        # Every rank takes exactly experience.batch_size steps, so the global count needs no collective.
        steps = self.rollout.run(progress) * distributed.world_size()
        self.agent_step += steps
        self.learner.policy.train()
        self.learner.run(progress)
        self.epoch += 1
        return steps

    def _evaluate(self) -> dict[str, float]:
        """``eval/*`` metrics (and a replay) at their intervals and after the last epoch, so a learning curve ends
        where the run does; empty on other epochs and without an evaluator."""
        if self.evaluator is None:
            return {}
        start = time.perf_counter()
        metrics = {}
        last = self.agent_step >= self.total_timesteps
        evaluate = self.eval_interval and (self.epoch % self.eval_interval == 0 or last)
        replay = self.replay_interval and (self.epoch % self.replay_interval == 0 or last)
        if not (evaluate or replay):
            return {}
        path = None
        with self.learner.produced_policy() as policy:  # the policy the run produces is what is evaluated
            if evaluate:
                metrics.update(self.evaluator.evaluate(policy))
            if replay:
                path = self.evaluator.replay(policy, self.epoch)
        if path is not None:
            for sink in self.sinks:
                sink.log_media("eval/replay", path, self.agent_step)
        if metrics:
            metrics["timing/eval"] = time.perf_counter() - start
        return metrics

    def _save(self) -> int:
        """Checkpoint the epoch: the parts' reports and state first (the training weights), then the file written
        with the produced policy swapped in."""
        if self.checkpointer is not None:
            problems, state, local = self.problems(), self.state_dict(), self.local_state_dict()
            with self.learner.produced_policy() as produced:
                self.checkpointer.save(state, local, produced, problems, self.keep_checkpoints)
        return self.epoch

    def _log(self, metrics: dict[str, float]) -> None:
        """Give each sink the epoch's row; a sink that cannot write stops training, and its message gets what the
        stop leaves (a sink does not know whether a checkpoint was written)."""
        try:
            for sink in self.sinks:
                sink.log(metrics)
        except TrainingStopped as err:
            raise TrainingStopped(f"{err}; {self._after_stop()}") from None

    def _after_stop(self) -> str:
        """What a stop leaves, in words: the checkpoint a start with the same run folder resumes from, or none."""
        if self.checkpointer is None:
            return "no checkpoint was written (this trainer has no checkpointer)"
        return self.checkpointer.after_stop()

    def epoch_metrics(self, steps: int, seconds: float, sps_cumulative: float) -> dict[str, float]:
        """The epoch's metrics, from its one host read of every device metric (and the stopwatch's phases).

        Under torchrun: loss and buffer metrics are means over the ranks (a NaN on one rank stops them all), the
        env's episode sums are summed, so the episode means are over every rank's episodes."""
        learner_metrics, host_metrics = self.learner.pop_metrics()
        # The parameters' finiteness rides along in the same read (checked by ``_check_finite``, not logged).
        finite = torch.stack([p.detach().isfinite().all() for p in self.learner.policy.parameters()]).all()
        means, stats = distributed.reduce_epoch(
            {**learner_metrics, **self.learner.experience.metrics(), PARAMS_FINITE: finite},
            self.rollout.env.episode_stats(),
        )
        device_metrics = {**means, **episode_metrics(stats)}
        # The one host read of the epoch: every device metric at once.
        values = torch.stack([v.float() for v in device_metrics.values()]).tolist()
        metrics = dict(zip(device_metrics, values, strict=True))
        metrics.update(host_metrics)
        metrics.update(
            {
                "metric/agent_step": self.agent_step,
                "metric/epoch": self.epoch,
                "overview/sps": steps / seconds,
                "overview/sps_cumulative": sps_cumulative,
                "overview/reward": metrics.get("env/return", float("nan")),
            }
        )
        if self.curriculum is not None:
            metrics["curriculum/stage"] = self.curriculum.stage(self.agent_step - steps)
        timings = self.learner.stopwatch.pop()
        for phase, secs in sorted(timings.items()):
            metrics[f"timing/{phase}"] = secs
            metrics[f"timing/{phase}_frac"] = secs / seconds
        metrics["timing/epoch"] = seconds
        return metrics

    def _check_finite(self, metrics: dict[str, float]) -> None:
        """Stop before logging an epoch whose losses or parameters are not finite (the optimizer step after the last
        loss can blow up the weights); removes ``PARAMS_FINITE`` from ``metrics``."""
        params_finite = metrics.pop(PARAMS_FINITE) == 1.0
        bad = [k for k, v in metrics.items() if k.startswith("losses/") and "/loss_" in k and not math.isfinite(v)]
        if bad:
            raise TrainingStopped(
                f"non-finite loss at epoch {self.epoch} (agent step {self.agent_step}): "
                + ", ".join(f"{k}={metrics[k]}" for k in bad)
                + f"; the epoch was not checkpointed; {self._after_stop()}; lower optimizer.lr, the loss's "
                "coefficients or learner.max_grad_norm"
            )
        if not params_finite:
            raise TrainingStopped(
                f"non-finite policy parameters after epoch {self.epoch} (agent step {self.agent_step}): the epoch was "
                f"not logged or checkpointed; {self._after_stop()}; lower optimizer.lr, the loss's coefficients or "
                "learner.max_grad_norm"
            )
