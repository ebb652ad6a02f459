"""The training phase: ``update_epochs`` passes of minibatches over the full buffer.

Per update epoch: the advantage estimator's advantages (``learner.advantage``; V-trace ratios of the current policy,
see ``update``), then the experience's minibatches. Per minibatch: one policy forward shared by all losses, the sum
of their ``loss_*`` terms, backward, grad-norm clip, optimizer step, ``zero_grad(set_to_none=True)``. How that update
runs (eager, one ``torch.compile``d function, or a CUDA graph per token width) is the ``Execution``'s choice; compiled
or graphed it is timed as ``train.update``. Metrics stay on the device and are summed; the trainer reads them once
per epoch. Under torchrun the forward goes through DDP (``machina.training.distributed.wrap``), which averages the
gradients over the ranks during backward.
"""

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from tensordict import TensorDict
from torch import nn

from machina import checks, keys
from machina.errors import ConfigError
from machina.files.snapshot import nonfinite
from machina.logging.stopwatch import Stopwatch
from machina.losses.base import Loss
from machina.policy.inputs import training_input
from machina.progress import Progress
from machina.schedules import Linear
from machina.training import distributed
from machina.training.execution import Execution
from machina.training.experience import Experience
from machina.training.optimizer_state import check_optimizer_state
from machina.training.team_spirit import TeamSpirit
from machina.training.weight_average import WeightAverage


class Learner:
    """Updates the policy from a full experience buffer (``conf/learner``; built by ``machina.startup.build``).

    Args:
        policy, losses, experience, optimizer, stopwatch: the parts it drives (injected).
        lr_schedule: multiplier of each parameter group's configured learning rate, from the fraction of training
            done (``machina.schedules``); set once per epoch.
        advantage: the advantage estimator (``machina.training.advantage``): experience -> float32 [S, T].
        execution: how the minibatch update runs (``machina.training.execution``); eager by default.
        update_epochs: passes over the buffer per epoch.
        max_grad_norm: global gradient-norm clip.
        target_kl: stop the epoch's remaining update passes once a pass's mean ``approx_kl`` (PPO's metric)
            exceeds it (CleanRL's ``target_kl``); costs one host read per update pass. None: never.
        average_horizon: agent steps: the time constant of an exponential average of the policy's weights over
            epochs (``machina.training.weight_average``), which is then the policy the run produces
            (``produced_policy``); 0: no average, the run produces the policy's own weights.
        between_minibatches: called before each minibatch (``System.follow_load``: torch's threads for the
            machine's load, so that a process that starts beside the run mid-epoch costs it a second, not the
            rest of the epoch); None calls nothing.
        team_spirit: tau, the share of each agent's reward replaced by its env's mean reward before the advantages
            (``machina.training.team_spirit``): a number in [0, 1] or a ``machina.schedules.Linear`` of the agent
            step; 0: the env's own rewards.
        agents_per_env: the agents of one env (``EnvSpec.agents_per_env``), the teams ``team_spirit`` mixes over.
        refresh_ratios: before each update pass after the first, one no-grad forward over the buffer refreshes
            V-trace's ratios to the current policy's (``update``); false: a pass's advantages use the ratios its
            minibatches recorded in the pass before, stale by up to one pass, and the forward is saved.
    """

    def __init__(
        self,
        policy: nn.Module,
        losses: dict[str, Loss],
        experience: Experience,
        optimizer: torch.optim.Optimizer,
        stopwatch: Stopwatch,
        lr_schedule: Callable[[float], float],
        advantage: Callable[[Experience], torch.Tensor],
        execution: Execution | None = None,
        update_epochs: int = 1,
        max_grad_norm: float = 0.5,
        target_kl: float | None = None,
        average_horizon: int = 0,
        between_minibatches: Callable[[], None] | None = None,
        team_spirit: float | Linear = 0.0,
        agents_per_env: int = 1,
        refresh_ratios: bool = True,
    ):
        checks.integer("learner.update_epochs", update_epochs, 1)
        checks.number("learner.max_grad_norm", max_grad_norm, 0, math.inf)
        if target_kl is not None:
            checks.number("learner.target_kl", target_kl, 0, math.inf)
        checks.integer("learner.average_horizon", average_horizon, 0)
        if not losses:
            raise ConfigError("losses=[] enables no loss, so nothing would be learned; choose one, e.g. losses=[ppo]")
        self.policy, self.losses, self.experience, self.optimizer = policy, losses, experience, optimizer
        self.model = distributed.wrap(policy)  # the policy itself in a single process
        self.stopwatch, self.lr_schedule, self.advantage = stopwatch, lr_schedule, advantage
        self.execution = execution or Execution()
        self.between_minibatches = between_minibatches
        self.team_spirit = TeamSpirit(team_spirit, agents_per_env)
        self.update_epochs, self.max_grad_norm, self.target_kl = update_epochs, max_grad_norm, target_kl
        self.refresh_ratios = checks.flag("learner.refresh_ratios", refresh_ratios)
        self.base_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        self.sums: dict[str, torch.Tensor] = {}  # summed over minibatches, averaged by pop_metrics
        self.once: dict[str, torch.Tensor | float] = {}  # per epoch: host values (schedules) and buffer statistics
        self.minibatches = 0
        self.trained_at: Progress | None = None  # the schedule of the last update (loss_check)
        epoch_steps = experience.batch_size * distributed.world_size()
        self.average = WeightAverage(policy, average_horizon, epoch_steps) if average_horizon else None
        # The compiled or graphed whole update (None: eager, each phase timed apart).
        self.whole_update = self.execution.update(
            self._update, policy, optimizer, losses, single_process=self.model is self.policy
        )

    def state_dict(self) -> dict:
        """The optimizer's state, and with a weight average its ``state_dict`` under ``average``. The policy's own
        weights are the trainer's entry (``Trainer.state_dict``)."""
        state = {"optimizer": self.optimizer.state_dict()}
        if self.average is not None:
            state["average"] = self.average.state_dict()
        return state

    def load_state_dict(self, saved: dict) -> None:
        """Restore the optimizer's state (moment estimates, step counts) but keep this run's hyper-parameters (lr,
        eps, betas, weight decay: every param_group entry but ``params``): the configured values win, so a changed
        ``optimizer.lr`` takes effect on resume. The saved state is checked first (``check_optimizer_state``).

        A saved ``average`` becomes this run's average when it has one; a run that stops averaging drops it, and one
        that starts averaging on resume starts its average at the next epoch. Neither reads nor writes the policy's
        weights, so this may run before or after they are restored."""
        check_optimizer_state(self.optimizer, saved["optimizer"])
        if "average" in saved and self.average is not None:
            self.average.load_state_dict(saved["average"])
        settings = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(saved["optimizer"])
        for group, fresh in zip(self.optimizer.param_groups, settings, strict=True):
            group.update(fresh)

    def problems(self) -> list[str]:
        """Why the learner's state is not good to resume from, in a few words each; empty when it is. Non-finite
        parameters, optimizer state or averaged weights are named; when all are finite, the losses must be finite
        with the current weights too (``loss_check``): weights that exploded but stayed finite (|w| ~ 1e20 after a
        too-large learning rate) give NaN at the next forward. Host reads: call it at checkpoint time only."""
        average = self.average.averaged if self.average is not None else {}
        state = {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()["state"]}
        bad = nonfinite({**state, "average": average})
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            return [f"non-finite values in {', '.join(bad[:3])}{more}"]
        losses = [f"{name}={value}" for name, value in self.loss_check().items() if not math.isfinite(value)]
        return [f"the weights give non-finite losses ({', '.join(losses)})"] if losses else []

    def loss_check(self) -> dict[str, float]:
        """The enabled losses' ``loss_*`` terms with the current weights, on the buffer's first ``minibatch_segments``
        rows (uniform weights) and at the schedule of the last update (``trained_at``): what ``problems`` reads, once
        per checkpoint. Empty before the first update. It changes nothing: no gradient, the run's RNG forked, the
        policy itself (not its DDP wrapper, which would sync buffers), and one host read. Eager in a compiled run:
        a forward without gradients would be compiled anew (half a minute on 2 cores) for a check that runs once
        per checkpoint."""
        if self.trained_at is None:
            return {}
        exp = self.experience
        devices = [exp.device] if exp.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices), torch.compiler.set_stance("force_eager"):
            batch = exp.first_minibatch(self.advantage(exp))
            policy_out = self.policy(training_input(batch.stored, batch.state))
            _, _, metrics, _ = self._losses(batch.data, policy_out, self.trained_at)
        terms = {name: value for name, value in metrics.items() if "/loss_" in name}
        return dict(zip(terms, torch.stack(list(terms.values())).float().tolist(), strict=True))

    def run(self, progress: Progress) -> None:
        """Train on the full buffer: its rewards mixed with ``team_spirit``, ``prepare``, then ``update``, then fold
        the new weights into the average."""
        self.once["train/team_spirit"] = self.team_spirit(self.experience, progress.agent_step)
        self.prepare()
        self.update(progress)
        if self.average is not None:
            self.average.update()

    @contextmanager
    def produced_policy(self) -> Iterator[nn.Module]:
        """The policy the run produces, as a block: inside it, the policy (yielded) holds the weight average with
        ``average_horizon`` (none before the average's first update), else its own weights, and its own again after
        the block. The one view that periodic evaluation, replays and policy files (``policy_<epoch>.pt``, the
        checkpoint's ``policy``) all use; in place, so a compiled or graphed policy plays it as it is."""
        if self.average is None:
            yield self.policy
            return
        with self.average.applied():
            yield self.policy

    def prepare(self) -> None:
        """The epoch's work before its minibatches: the experience's training view (with ``compact_tokens``, the
        epoch's only host read)."""
        self.experience.prepare_training()

    def update(self, progress: Progress) -> None:
        """``update_epochs`` passes of minibatches over ``prepare``'s view; no host read (but ``target_kl``'s).

        V-trace (Espeholt et al. 2018) clips rho_t = pi(a_t|x_t) / mu(a_t|x_t) with pi the policy being trained, so
        each pass's advantages use the ratios of the policy as it stands when that pass starts:

        - pass 1: the buffer's ``RATIO`` is 1 (``reset_for_rollout``): the policy has not moved since it acted.
        - pass k > 1: the policy after every minibatch step of pass k - 1. ``_refresh_ratios`` rewrites ``RATIO``
          from one no-grad forward over the whole buffer, in ``minibatch_segments`` row blocks. This costs
          ``update_epochs - 1`` extra forwards (no backward) of the buffer per epoch, about a third of a pass each.
          The ratios the minibatches record while they train are not those: minibatch j's are those of the policy
          after j - 1 steps of that pass, stale by up to a whole pass for the rows trained early in it.
          ``refresh_ratios=false`` uses them all the same and saves the forward.

        Each minibatch still records its ratio into ``RATIO`` (the policy before its own step), which is what the
        buffer holds after the last pass (``experience/ratio_mean`` and ``loss_check`` read it).
        """
        exp, sw = self.experience, self.stopwatch
        self.trained_at = progress
        multiplier = self.lr_schedule(progress.fraction)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(base * multiplier)
            else:
                group["lr"] = base * multiplier
        self.once["train/lr"] = self.base_lrs[0] * multiplier
        passes = 0
        for update in range(self.update_epochs):
            if update > 0 and self.refresh_ratios:
                with sw.time("train.ratio"):
                    self._refresh_ratios()
            with sw.time("train.advantage"):
                advantages = self.advantage(exp)
                if update == 0:
                    values = exp.rows(keys.VALUES)
                    active = exp.rows(keys.ACTIVE) if exp.stores(keys.ACTIVE) else None
                    self.once["experience/explained_variance"] = explained_variance(values, advantages + values, active)
                exp.prepare_minibatches(advantages, progress.fraction)
            kl_sum = torch.zeros((), device=exp.device)
            for mb_index in range(exp.num_minibatches):
                if self.between_minibatches is not None:
                    self.between_minibatches()
                with sw.time("train.sample"):
                    batch = exp.minibatch(mb_index, advantages)
                if self.whole_update is not None:
                    self.execution.mark_dynamic(batch.stored, exp.varying_dims)
                    with sw.time("train.update"):
                        new_log_prob, kl, metrics, host = self.whole_update(
                            batch.stored, batch.data, batch.state, progress
                        )
                else:
                    new_log_prob, kl, metrics, host = self._update_timed(
                        batch.stored, batch.data, batch.state, progress
                    )
                for name, value in metrics.items():
                    self._add(name, value)
                self.once.update(host)
                kl_sum += kl
                exp.record_ratios(batch.rows, batch.stored, new_log_prob)
                self.minibatches += 1
            passes += 1
            if self.target_kl is not None and float(kl_sum) / exp.num_minibatches > self.target_kl:
                break  # the one host read of an update pass, only with target_kl set
        self.once["train/update_passes"] = float(passes)

    @torch.no_grad()
    def _refresh_ratios(self) -> None:
        """Rewrite the buffer's ``RATIO`` in place as pi(a|x) / mu(a|x) of the current policy, mu the stored
        ``ACT_LOG_PROB``: a no-grad forward of the training view in its contiguous ``blocks`` of
        ``minibatch_segments`` rows (each with its stored row state, as a minibatch sees it; the minibatch's
        shapes). Through the policy itself, not its DDP wrapper (no buffer sync, no gradient); no host read, and the
        ratios are written into the buffer's own rows, so nothing is allocated beyond the forward. With
        ``system.compile`` the policy is compiled in place: this no-grad forward is one more graph, compiled once
        (the token width marked dynamic as in the update)."""
        exp = self.experience
        for rows in exp.blocks:
            stored, state = exp.segments_at(rows)
            self.execution.mark_dynamic(stored, exp.varying_dims)
            out = self.policy(training_input(stored, state))
            exp.record_ratios(rows, stored, out[keys.ACT_LOG_PROB])

    def _update_timed(self, stored: TensorDict, minibatch: TensorDict, state: TensorDict, progress: Progress):
        """One minibatch's update, eager, with its phases timed apart; returns what ``_update`` does."""
        with self.stopwatch.time("train.forward"):
            policy_out, total, kl, metrics, host = self._forward(stored, minibatch, state, progress)
        with self.stopwatch.time("train.backward"):
            total.backward()
        with self.stopwatch.time("train.optimizer"):
            metrics["train/grad_norm"] = self._step()
        return policy_out[keys.ACT_LOG_PROB].detach(), kl, metrics, host

    def _update(
        self, stored: TensorDict, minibatch: TensorDict, state: TensorDict, progress: Progress
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, float]]:
        """One minibatch's whole update (forward, losses, backward, clip, optimizer step) in one function, which
        ``torch.compile`` turns into graphs (forward and losses with their backward, then clip and step). Returns
        (new act_log_prob [S, T], the summed approx_kl, device metrics, host metrics)."""
        policy_out, total, kl, metrics, host = self._forward(stored, minibatch, state, progress)
        total.backward()
        metrics["train/grad_norm"] = self._step()
        return policy_out[keys.ACT_LOG_PROB].detach(), kl, metrics, host

    def _forward(self, stored: TensorDict, minibatch: TensorDict, state: TensorDict, progress: Progress):
        """The policy forward and the losses: (policy outputs, summed loss, summed approx_kl, metrics, host)."""
        policy_out = self.model(training_input(stored, state))
        total, kl, metrics, host = self._losses(minibatch, policy_out, progress)
        if self.model is not self.policy:
            total = total + distributed.zero_term(self.policy)
        return policy_out, total, kl, metrics, host

    def _step(self) -> torch.Tensor:
        """Clip, optimizer step, zero the gradients; returns the gradient norm before clipping (0-d, on device)."""
        grad_norm = nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _losses(self, minibatch: TensorDict, policy_out: TensorDict, progress: Progress):
        """One minibatch's summed ``loss_*`` terms, summed ``approx_kl`` metrics (for target_kl), device metrics
        ``losses/<loss>/<key>`` and host metrics (schedules, never sent to the device)."""
        total = torch.zeros((), device=self.experience.device)
        kl = torch.zeros((), device=self.experience.device)
        metrics: dict[str, torch.Tensor] = {}
        host: dict[str, float] = {}
        for name, loss in self.losses.items():
            for key, value in loss(minibatch, policy_out, progress).items():
                metric = f"losses/{name}/{key}"
                if not isinstance(value, torch.Tensor):
                    host[metric] = float(value)
                elif key.startswith("loss_"):
                    total = total + value
                    metrics[metric] = value.detach()
                else:
                    metrics[metric] = value
                    if key == "approx_kl":
                        kl = kl + value
        return total, kl, metrics, host

    def _add(self, name: str, value: torch.Tensor) -> None:
        if name in self.sums:
            self.sums[name] += value
        else:
            self.sums[name] = value.detach().clone()

    def pop_metrics(self) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """(device metrics, host metrics) since the last call: the mean over the minibatches of every summed
        metric plus the epoch's buffer statistics as 0-d device tensors, and the host values as floats."""
        n = max(self.minibatches, 1)
        device = {name: total / n for name, total in self.sums.items()}
        host = {}
        for name, value in self.once.items():
            if isinstance(value, torch.Tensor):
                device[name] = value
            else:
                host[name] = value
        self.sums, self.once, self.minibatches = {}, {}, 0
        return device, host


def explained_variance(values: torch.Tensor, returns: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns), over all samples or the bool ``rows`` (those whose agent acted)
    (CleanRL's ``explained_var``): 1 is a perfect critic, 0 no better than a constant, negative worse. A 0-d device
    tensor (NaN when the returns are constant)."""
    total_var = variance(returns, rows)
    return torch.where(total_var > 0, 1.0 - variance(returns - values, rows) / total_var, float("nan"))


def variance(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """The unbiased variance of ``x``, or of its ``rows`` (bool, x's shape) without a host read."""
    if rows is None:
        return x.var()
    count = rows.sum()
    mean = x.where(rows, 0.0).sum() / count.clamp(min=1)
    return (x - mean).square().where(rows, 0.0).sum() / (count - 1).clamp(min=1)
