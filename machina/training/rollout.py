"""The rollout phase: act in the env until the experience buffer is full.

One step, for all N agents at once:
    policy acts on the live step (its observation and each agent's recurrent state, zeroed where an episode began)
    -> losses' ``on_rollout_step`` (teacher-led actions) -> env.step(ACTIONS) -> the step gets the action's reward
    and episode end (and V(final observation) on truncations the env does not observe) -> losses' ``on_env_step``
    (reward shaping) -> store -> the env's new observation and the policy's next state are copied into the live step.
After the last step, one more forward gives V of the observation the rollout ends on: the bootstrap of every
agent's last stored step. Nothing here reads a device value on the host.

The live step is allocated once and written in place, so a step reads and writes fixed addresses: with a graph
(``system.cuda_graphs``) the policy forward and the env step replay as one CUDA graph when no loss acts between
them, else the forward alone does (``cuda_graph.py``); the ``Execution`` decides whether to compile or capture.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from tensordict import TensorDict
from torch import nn

from machina import keys
from machina.env.base import Capturable, Env, Grouped, Resumable
from machina.errors import ConfigError
from machina.files import saved_state
from machina.files.saved_state import within
from machina.files.snapshot import pack
from machina.logging.stopwatch import Stopwatch
from machina.losses.base import Loss
from machina.progress import Progress
from machina.training.execution import Execution
from machina.training.experience import Experience

# What every stored step takes from the env's output for the action it executed.
OUTCOME_KEYS = (keys.REWARDS, keys.TERMINATED, keys.TRUNCATED)
ROLLOUT_HOOKS = ("on_rollout_step", "on_env_step")  # the loss hooks that see each step
ENV = "env"  # the env's result, nested in the outputs of a captured whole step


class Rollout:
    """Owns the live env state between epochs: the step the policy acts on next and each agent's recurrent state.

    What the env can do beyond the core is asked once, here (``machina.env.base``): ``Grouped`` (two groups:
    overlapped steps), ``Capturable`` (the whole step in one graph), ``Resumable`` (a restore continues its episodes).

    Args:
        env: a batched env (``machina.env.base.Env``).
        policy: the component policy; ``policy.act`` runs on batch [N].
        losses: enabled losses, in order; their rollout hooks run around the env step.
        experience: the buffer to fill.
        execution: eager, compiled (the policy's rollout step) or graphed (``machina.training.execution``).
    """

    def __init__(
        self,
        env: Env,
        policy: nn.Module,
        losses: dict[str, Loss],
        experience: Experience,
        stopwatch: Stopwatch,
        execution: Execution | None = None,
    ):
        execution = execution or Execution()
        self.env, self.policy, self.losses, self.experience, self.stopwatch = env, policy, losses, experience, stopwatch
        self.device = experience.device
        self.num_agents = env.spec.num_agents
        self.bootstrap_truncations = not env.spec.observes_time
        self.state_keys = policy.state_keys
        # The live step: the env's observation keys, EPISODE_START and the recurrent state, batch [N]. It is only
        # ever written in place, so its tensors are fixed: the hot path reads them from plain dicts (``inputs``, the
        # policy's; ``observed``, the stored step's) and ``sources`` says where ``_advance`` fills each from.
        self.live = self._observed(env.reset())
        self.live.update(policy.initial_state(self.num_agents, self.device))
        self.inputs = dict(self.live.items())
        self.observed = {key: value for key, value in self.inputs.items() if key not in self.state_keys}
        self.source_keys = [(key, keys.NEXT_STATE.get(key, key)) for key in self.inputs]
        self.sources = [(self.inputs[key], source) for key, source in self.source_keys]
        hooks_between = any(overrides(loss, "on_rollout_step") for loss in losses.values())
        hooked = [loss for loss in losses.values() if any(overrides(loss, hook) for hook in ROLLOUT_HOOKS)]
        # Losses see each step as a TensorDict; without step hooks the buffer reads a plain dict, a third the cost.
        self.hooked = bool(hooked)
        # Policy outputs that rollout hooks and the buffer may read: those the policy writes per step that the buffer
        # stores or a hooked loss consumes (its class's ``consumes``, the one list of what a loss reads).
        consumed = frozenset().union(*(type(loss).consumes for loss in hooked))
        self.policy_keys = tuple(k for k in policy.output_keys() if k in experience.step_keys or k in consumed)
        self.keep = (*self.policy_keys, *(keys.NEXT_STATE[k] for k in self.state_keys))
        self.act = execution.function(policy.act)
        # An env stepped elsewhere in two groups: act on one group while the other steps (``_run_overlapped``).
        # Losses' step hooks see whole steps and a graph replays a whole step, so either keeps the whole step.
        grouped = isinstance(env, Grouped) and env.groups == 2
        self.groups = 2 if grouped and not self.hooked and not execution.graphs else 1
        self.host_processes = env.host_processes if isinstance(env, Grouped) else 0
        size = self.num_agents // self.groups
        self.group_agents = [slice(g * size, (g + 1) * size) for g in range(self.groups)]
        self.whole_step = self.forward = None  # captured calls, when graphed
        if execution.graphs:
            if isinstance(env, Capturable) and not hooks_between:
                self.whole_step = execution.capture(self._act_and_step, self.inputs, self._env_snapshot)
            else:
                self.forward = execution.capture(self._act, self.inputs, lambda: lambda: None)

    @property
    def step_td(self) -> TensorDict:
        """The step the policy acts on next (batch [N]): the live step without the recurrent state."""
        return self.live.exclude(*self.state_keys)

    @property
    def state(self) -> TensorDict:
        """Each agent's recurrent state before the next step (batch [N]; no keys for a feed-forward policy)."""
        return self.live.select(*self.state_keys)

    def state_dict(self) -> dict:
        """The observation the next rollout acts on and each agent's recurrent state, as plain data."""
        return {"step": pack(self.step_td), "state": pack(self.state)}

    def load_state_dict(self, saved: dict) -> None:
        """Continue from ``saved`` (after the env's own ``load_state_dict``). The observation keys come from the
        restored env (``observe``): an env's observation is a function of its state, which the env checked on load,
        so no saved observation reaches the policy unchecked. The checkpoint gives only what the env does not hold:
        each agent's ``EPISODE_START`` (0 or 1) and recurrent state (this policy's keys, shapes and dtypes, finite).
        An env that started new episodes on load (``continues_episodes`` False) is acted on from its first
        observations with fresh recurrent state: the saved ones belong to episodes that no longer exist. An env
        that is not ``Resumable`` restored nothing: it starts its episodes anew here (``reset``)."""
        if not isinstance(self.env, Resumable) or not self.env.continues_episodes:
            fresh = self.env.observe() if isinstance(self.env, Resumable) else self.env.reset()
            self.live.update_(self._observed(fresh))
            self.live.update_(self.policy.initial_state(self.num_agents, self.device))
            return
        observed = self._observed(self.env.observe())
        start = self.live[keys.EPISODE_START]
        with within("step.tensors."):
            starts = saved_state.tensor(saved["step"]["tensors"], keys.EPISODE_START, start.shape, start.dtype, 0, 1)
        if not bool(((starts == 0) | (starts == 1)).all()):
            raise ConfigError(f"step.tensors.{keys.EPISODE_START} holds values other than 0 and 1")
        live_state = {key: self.live[key] for key in self.state_keys}
        state = saved_state.like(saved["state"]["tensors"], live_state, "state.tensors")
        observed[keys.EPISODE_START] = starts
        self.live.update_(observed)
        for key, value in state.items():
            self.live[key].copy_(value)

    def run(self, progress: Progress) -> int:
        """Fill the buffer; return the number of agent steps taken.

        Eager steps run in inference mode, not only without gradients: an op then skips autograd's version-counter
        and view bookkeeping, a sixth of a small step's host time. What a step makes is copied into the buffer and
        the live step (tensors made outside, written in place) or kept by a loss for its next rollout step (a
        teacher's recurrent state), so no inference tensor reaches the learner (``tests/test_rollout.py``). They also
        run inside ``policy.weights_fixed()`` (no weight changes during a rollout): what the policy derives from its
        weights alone, the encoder's table, is built once per rollout instead of once per step. A graphed
        rollout replays kernels with no per-op host work to save, and is captured without gradients only: a graph
        captured in inference mode can leave the CUDA generator's state as inference tensors, which the learner's
        capture outside it may not update (pytorch/pytorch#166792)."""
        graphed = self.whole_step is not None or self.forward is not None
        if graphed:
            with torch.no_grad():
                return self._run(progress)
        with torch.inference_mode(), self.policy.weights_fixed():
            return self._run(progress)

    def _run(self, progress: Progress) -> int:
        exp, sw = self.experience, self.stopwatch
        exp.reset_for_rollout()
        with sw.time("rollout.prepare"):
            self.env.prepare_rollout(exp.batch_size // self.num_agents)
        for loss in self.losses.values():
            loss.on_rollout_start(progress)
        if self.groups > 1:
            return self._run_overlapped(progress)
        steps = 0
        while not exp.full:
            if self.whole_step is not None:
                with sw.time("rollout.step"):
                    out = self.whole_step()
                    result = out[ENV]
                step = self._step(out)
            else:
                with sw.time("rollout.inference"):
                    out = self.forward() if self.forward is not None else self._act(self.inputs)
                step = self._step(out)
                with sw.time("rollout.hooks"):
                    for loss in self.losses.values():
                        loss.on_rollout_step(step, progress)
                with sw.time("rollout.env"):
                    result = self.env.step(step[keys.ACTIONS])
            self._record(step, result, out, progress)
            steps += self.num_agents
        with sw.time("rollout.inference"):
            exp.store_last_values(self.act(dict(self.inputs))[keys.VALUES])
        return steps

    def _run_overlapped(self, progress: Progress) -> int:
        """``_run`` for an env of two groups: while the env steps one group, the policy acts on the other. Per group
        g, in turn: receive g's step, store it (its slice of the buffer's column), advance g's live step, act on it
        and send g's actions. Each group sees exactly the steps of ``_run``; only the order of the policy's random
        draws differs (one draw per group), so a seed gives the same run for a fixed group count."""
        with self._cores_left_to_workers():
            return self._steps_overlapped(progress)

    @contextmanager
    def _cores_left_to_workers(self) -> Iterator[None]:
        """On the CPU, act with one torch thread fewer per process that steps the env (at least one) while it runs:
        the policy's threads would otherwise take the cores the workers step the other group on (on 2 cores with 1
        worker, 1.15x the end-to-end agent-steps/s; docs/reference/benchmarks.md)."""
        threads = torch.get_num_threads()
        if self.device.type != "cpu" or not self.host_processes:
            yield
            return
        torch.set_num_threads(max(1, threads - self.host_processes))
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def _steps_overlapped(self, progress: Progress) -> int:
        exp, sw = self.experience, self.stopwatch
        views = [{key: value[agents] for key, value in self.inputs.items()} for agents in self.group_agents]
        pending = [self._send(g, views[g]) for g in range(self.groups)]
        steps = exp.batch_size // self.num_agents
        for t in range(steps):
            for g, agents in enumerate(self.group_agents):
                out, step = pending[g]
                with sw.time("rollout.env"):
                    result = self.env.recv(g)
                self._record(step, result, out, progress, views[g], agents)
                if t + 1 < steps:
                    pending[g] = self._send(g, views[g])
        with sw.time("rollout.inference"):
            exp.store_last_values(self.act(dict(self.inputs))[keys.VALUES])
        return steps * self.num_agents

    def _record(
        self,
        step: TensorDict | dict[str, torch.Tensor],
        result: TensorDict,
        out: dict[str, torch.Tensor],
        progress: Progress,
        live_views: dict[str, torch.Tensor] | None = None,
        agents: slice | None = None,
    ) -> None:
        """Complete ``step`` with the env's ``result`` for its action (outcome, V(final observation) on truncations,
        the losses' ``on_env_step``), store it and advance the live step: all agents', or one group's (``agents``,
        with ``live_views`` its views of the live step)."""
        with self.stopwatch.time("rollout.hooks"):
            for key in OUTCOME_KEYS:
                step[key] = result[key]
            if self.bootstrap_truncations:
                step[keys.FINAL_VALUES] = self._final_values(result, out)
            for loss in self.losses.values():
                loss.on_env_step(step, progress)
        with self.stopwatch.time("rollout.store"):
            self.experience.store(step, self.live if live_views is None else live_views, agents)
            self._advance(result, out, live_views)

    def _send(self, group: int, inputs: dict[str, torch.Tensor]) -> tuple[dict, dict]:
        """Act on ``group``'s live step (``inputs``: its views) and send its actions; return the policy's outputs
        and the step as the buffer will store it."""
        with self.stopwatch.time("rollout.inference"):
            out = self._act(inputs)
        step = {key: inputs[key] for key in self.observed}
        step.update({key: out[key] for key in self.policy_keys})
        with self.stopwatch.time("rollout.env"):
            self.env.send(group, step[keys.ACTIONS])
        return out, step

    def _act(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The policy's outputs for the live step's tensors ``inputs``: the kept per-step outputs and the next state
        [N, ...]. The policy writes into a shallow copy, so ``inputs`` keeps only the live step's tensors."""
        out = self.act(dict(inputs))
        return {key: out[key] for key in self.keep}

    def _act_and_step(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``_act`` then the env step of its actions (the env's result under ``ENV``): one rollout step's device
        work when no loss acts between the two."""
        out = self._act(inputs)
        out[ENV] = self.env.step(out[keys.ACTIONS])
        return out

    def _env_snapshot(self) -> Callable[[], None]:
        """Save the env (warm-up steps of a capture advance it); return the function that restores it."""
        saved = self.env.state_dict()
        return lambda: self.env.load_state_dict(saved)

    def _step(self, out: dict[str, torch.Tensor]) -> TensorDict | dict[str, torch.Tensor]:
        """The step as hooks and the buffer see it, [N, ...]: the live step's inputs and the policy's outputs (no
        copies); a TensorDict (batch [N]) when a loss has step hooks, else a dict of the same tensors."""
        step = dict(self.observed)
        for key in self.policy_keys:
            step[key] = out[key]
        return TensorDict(step, batch_size=[self.num_agents], device=self.device) if self.hooked else step

    def _advance(
        self, result: TensorDict, out: dict[str, torch.Tensor], live_views: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Copy the env's new observation and the policy's next state into the live step (into ``live_views``, one
        group's views of the live step's inputs, when the step was that group's)."""
        sources = self.sources if live_views is None else [(live_views[k], s) for k, s in self.source_keys]
        for live, source in sources:
            if source == keys.EPISODE_START:
                torch.logical_or(result[keys.TERMINATED], result[keys.TRUNCATED], out=live)
            elif source in out:
                live.copy_(out[source])
            else:
                live.copy_(result[source])

    def _final_values(self, result: TensorDict, out: dict[str, torch.Tensor]) -> torch.Tensor:
        """V(FINAL_OBS) where an agent was truncated, else 0: float32 [N]. The final observation continues the
        episode the state belongs to, so the policy sees it with that state and no reset."""
        n = result.batch_size[0]  # N, or one group's agents
        if keys.FINAL_OBS not in result.keys():  # no truncation on this step (a key check, not a device read)
            return torch.zeros(n, device=self.device)
        final = TensorDict(
            {keys.OBS: result[keys.FINAL_OBS], keys.EPISODE_START: torch.zeros(n, device=self.device)}, batch_size=[n]
        )
        final.update({key: out[keys.NEXT_STATE[key]] for key in self.state_keys})
        values = self.act(final)[keys.VALUES]
        return torch.where(result[keys.TRUNCATED], values, 0.0)

    def _observed(self, result: TensorDict) -> TensorDict:
        """The env's observation keys of ``result`` (outcomes dropped) with ``EPISODE_START`` 1: a first step."""
        step = result.exclude(*OUTCOME_KEYS, keys.FINAL_OBS)
        step[keys.EPISODE_START] = torch.ones(self.num_agents, device=self.device)
        return step


def overrides(loss: Loss, hook: str) -> bool:
    """Whether ``loss`` implements the rollout hook ``hook`` (the base class's does nothing)."""
    return getattr(type(loss), hook) is not getattr(Loss, hook)
