"""Machina1Env: machina's built-in environment, a fully batched, device-resident re-creation of the *shape* of
MettaGrid's machina_1 mission, written in torch. It is not MettaGrid and shares no code or exact rules with it.

E envs x A agents ("cogs", 4 by default) live as tensors on one device, and ``step(actions)`` advances all of them
with tensor ops (no Python loop over envs, agents or cells). Agent index = env_index * agents_per_env + slot.

World: a ``height x width`` interior with a wall border, random obstacles, ``extractors_per_resource`` extractors of
each of 4 resources (carbon, oxygen, germanium, silicon), one assembler and one chest; a new random layout every
episode. Actions (``Discrete(5 + num_vibes)``): 0 noop, 1-4 move N/E/S/W, then ``num_vibes`` vibe actions that set
the agent's vibe, which other agents see as a token. Moving into an object uses it:

- extractor: +1 unit of its resource if it is off cooldown and the agent holds fewer than ``inventory_cap``;
  the extractor then cools down for ``extractor_cooldown`` steps (using it again earlier gives nothing);
- assembler: one unit of each of the 4 resources -> one heart (if hearts < ``inventory_cap``);
- chest: deposits all the agent's hearts; every agent of the env gets ``heart_reward`` per heart deposited.

Agents block each other: an agent cannot move into a cell another agent stands on at the start of the step, and
when several agents move into (or use) the same cell in one step, the lowest agent slot wins and the others stay.
Shaping: ``resource_reward`` per unit gathered and ``heart_made_reward`` per heart made, to the agent that did it.

Episodes end only by truncation at ``max_steps``; ended envs reset in place within the same ``step`` (see ``step``).
The first episodes are staggered: each env starts its first episode at a random step counter in [0, max_steps),
drawn as a random permutation modulo max_steps, so first-episode lengths lie in [1, max_steps] and at most
ceil(num_envs / max_steps) envs end on any one step. Randomness comes only from one ``torch.Generator`` seeded from
``seed`` on ``device``.
"""

import math
import sys

import torch
from tensordict import TensorDict

from machina import keys
from machina.env import layout as layouts
from machina.env.grid import (
    AGENT,
    ASSEMBLER,
    CHEST,
    EMPTY,
    EXTRACTOR,
    F_COOLDOWN,
    F_TYPE,
    F_VIBE,
    HEART,
    INVENTORY_SLOTS,
    NUM_GOALS,
    NUM_RESOURCES,
    WINDOW,
    Geometry,
    feature_table,
)
from machina.env.spec import EnvSpec, ObsSpec
from machina.env.teacher import distance_fields, teacher_actions
from machina.env.tokens import TokenEncoder, cell_token

assert sys.byteorder == "little", "tokens are packed into int32s and read back as bytes (little-endian)"

STAT_NAMES = ("episodes", "return", "length", "hearts_made", "hearts_deposited", "resources_gathered")
NUM_MOVES = 5  # noop + 4 directions; vibe actions follow


class Machina1Env:
    """E envs x A agents of the machina_1 re-creation. See the module docstring for the rules.

    State tensors (all on ``device``; P = cells of one padded board, X = 4 * extractors_per_resource):
    ``grid`` uint8 [E, P], ``pos`` int64 [E, A], ``inv`` int16 [E, A, 5] (4 resources, hearts), ``vibe`` int64
    [E, A], ``cooldown`` int16 [E, X + 1] (last slot is scratch), ``t`` int64 [E] step counter of the episode,
    ``ep`` float32 [E, 5] running episode sums (return summed over agents, length, hearts made, hearts deposited,
    resources gathered), ``totals`` float32 [6] stats of ended episodes, plus per-layout caches (``ext_pos``,
    ``ext_of_cell``, ``cell_types`` and, with the teacher, the distance fields ``dist``).
    """

    def __init__(
        self,
        num_envs: int = 256,
        agents_per_env: int = 4,
        height: int = 11,
        width: int = 11,
        obstacle_density: float = 0.1,
        extractors_per_resource: int = 2,
        max_steps: int = 200,
        num_vibes: int = 16,
        max_tokens: int = 128,
        heart_reward: float = 1.0,
        heart_made_reward: float = 0.5,
        resource_reward: float = 0.1,
        extractor_cooldown: int = 8,
        inventory_cap: int = 4,
        seed: int = 0,
        device: str | torch.device = "cpu",
        teacher: bool = True,
    ):
        if not 1 <= agents_per_env <= 10:
            raise ValueError(f"agents_per_env must be in 1..10, got {agents_per_env}")
        if min(num_envs, height, width, max_steps, max_tokens) < 1 or not 0 < inventory_cap < 256:
            raise ValueError("num_envs, height, width, max_steps, max_tokens must be >= 1 and inventory_cap in 1..255")
        if not 0 <= extractor_cooldown < 256 or num_vibes < 0 or height + width > 500:
            raise ValueError("extractor_cooldown must be in 0..255, num_vibes >= 0, height + width <= 500")
        self.device = torch.device(device)
        self.num_envs, self.agents_per_env = num_envs, agents_per_env
        self.num_agents = num_envs * agents_per_env
        self.max_steps, self.teacher = max_steps, teacher
        self.heart_reward, self.heart_made_reward, self.resource_reward = (
            heart_reward,
            heart_made_reward,
            resource_reward,
        )
        self.extractor_cooldown, self.inventory_cap = extractor_cooldown, inventory_cap
        self.geom = Geometry(height, width)
        self.sampler = layouts.LayoutSampler(
            self.geom, agents_per_env, extractors_per_resource, round(obstacle_density * height * width), self.device
        )
        self.num_extractors = self.sampler.num_extractors
        objects = 2 * agents_per_env + self.num_extractors  # agents' type and vibe tokens, extractors' cooldowns
        self.encoder = TokenEncoder(self.geom, max_tokens, objects, num_envs, agents_per_env, self.device)
        self.sweeps = 2 * (height + width)  # BFS sweeps: paths longer than this count as unreachable for the teacher

        names, norms = feature_table(extractor_cooldown, num_vibes, inventory_cap)
        actions = ("noop", "move_north", "move_east", "move_south", "move_west")
        actions += tuple(f"vibe_{v}" for v in range(num_vibes))
        self.num_actions = len(actions)
        # The episode_progress token tells the policy how far the episode is: a time-limit end is observed.
        obs_spec = ObsSpec(max_tokens, WINDOW, names, norms)
        self.spec = EnvSpec(num_envs, agents_per_env, self.num_actions, obs_spec, actions, teacher, observes_time=True)

        dev, e, a, p = self.device, num_envs, agents_per_env, self.geom.cells
        self.deltas = self.geom.move_deltas(dev)
        self.action_delta = torch.cat([self.deltas, self.deltas.new_zeros(num_vibes)])  # int64 [num_actions]
        self.inside = self.geom.template(dev) != EMPTY
        self.inside[self.geom.interior(dev)] = True
        slots = torch.arange(a, device=dev)
        self.lower = (slots.view(1, -1) < slots.view(-1, 1)).unsqueeze(0)  # [1, A, A]: [i, j] = j has priority
        self.others = (slots.view(1, -1) != slots.view(-1, 1)).unsqueeze(0)
        self.agent_type = torch.full((e, a), cell_token(F_TYPE, AGENT), dtype=torch.int32, device=dev)
        self.generator = torch.Generator(dev)
        self.generator.manual_seed(seed)
        # Resets per step are bounded by the balanced stagger. On accelerators (sync_free) a fixed number of envs
        # is reset each step (no host sync), so the bound must hold; hand-made layouts (set_layout) lift it to E.
        self.sync_free = self.device.type != "cpu"
        self._reset_capacity = math.ceil(e / max_steps)

        x = self.num_extractors
        self.state = {
            "grid": torch.zeros(e, p, dtype=torch.uint8, device=dev),
            "ext_pos": torch.zeros(e, x, dtype=torch.int64, device=dev),
            "ext_of_cell": torch.full((e, p), x, dtype=torch.int64, device=dev),
            "cell_types": torch.zeros(e, p, dtype=torch.int32, device=dev),
            "cooldown": torch.zeros(e, x + 1, dtype=torch.int16, device=dev),
            "pos": torch.zeros(e, a, dtype=torch.int64, device=dev),
            "inv": torch.zeros(e, a, INVENTORY_SLOTS, dtype=torch.int16, device=dev),
            "vibe": torch.zeros(e, a, dtype=torch.int64, device=dev),
            "t": torch.zeros(e, dtype=torch.int64, device=dev),
            "ep": torch.zeros(e, 5, dtype=torch.float32, device=dev),
            "totals": torch.zeros(len(STAT_NAMES), dtype=torch.float32, device=dev),
        }
        if teacher:
            self.state["dist"] = torch.zeros(e, p, NUM_GOALS, dtype=torch.int16, device=dev)
        self._start_all()

    # ----------------------------------------------------------------------------------------------- public API
    @classmethod
    def from_ascii(cls, rows: list[str], num_envs: int = 1, **kwargs) -> "Machina1Env":
        """An env whose every env starts on the hand-made map ``rows`` (see ``layout.parse_ascii`` for the legend:
        ``#`` wall, ``o`` obstacle, ``.`` empty, ``C O G S`` extractors, ``&`` assembler, ``=`` chest, digits =
        agent slots). height / width come from the map; later episodes get random layouts as usual, so pass a large
        ``max_steps`` to stay on the map. Other keyword arguments go to the constructor."""
        kwargs.setdefault("obstacle_density", 0.0)
        env = cls(num_envs=num_envs, height=len(rows) - 2, width=len(rows[0]) - 2, **kwargs)
        for i in range(num_envs):
            env.set_layout(i, rows)
        return env

    def set_layout(self, env_index: int, rows: list[str]) -> None:
        """Start a fresh episode (step 0, empty inventories) of env ``env_index`` on the hand-made map ``rows``."""
        lay = layouts.parse_ascii(rows, self.geom, self.agents_per_env, self.num_extractors, self.device)
        idx = torch.tensor([env_index], device=self.device)
        self._start_episodes(idx, lay, torch.zeros(1, dtype=torch.int64, device=self.device))
        self.state["ep"][env_index] = 0
        self._reset_capacity = self.num_envs

    def reset(self) -> TensorDict:
        """New random layouts and staggered step counters for all envs; clears episode stats. Returns observe()."""
        self._start_all()
        return self.observe()

    def observe(self) -> TensorDict:
        """The current observation TensorDict (zero rewards, no termination), as ``reset`` returns it."""
        zeros = torch.zeros(self.num_agents, dtype=torch.bool, device=self.device)
        return self._output(torch.zeros(self.num_agents, device=self.device), zeros, zeros)

    def step(self, actions: torch.Tensor) -> TensorDict:
        """Advance every env by one step.

        actions: int64 (or int32) [N] with ids in [0, num_actions). Returns a TensorDict, batch [N]: OBS uint8
        [N, M, 3], REWARDS float32 [N], TERMINATED bool [N] (always False), TRUNCATED bool [N], and TEACHER_ACTIONS
        int64 [N] when teacher=True. For envs whose episode ended at this step, REWARDS / TRUNCATED describe the
        step that just finished while OBS (and TEACHER_ACTIONS) already belong to the first step of the new episode.
        """
        s = self.state
        e, a = self.num_envs, self.agents_per_env
        act = self._check_actions(actions).view(e, a)
        pos, inv, cooldown = s["pos"], s["inv"], s["cooldown"]
        cooldown.sub_(1).clamp_(min=0)
        s["vibe"] = torch.where(act >= NUM_MOVES, act - NUM_MOVES, s["vibe"])

        moving = (act >= 1) & (act < NUM_MOVES)
        target = pos + self.action_delta[act]
        kind = s["grid"].gather(1, target)
        same_target = (target.unsqueeze(2) == target.unsqueeze(1)) & moving.unsqueeze(1) & self.lower
        acts = moving & ~same_target.any(2)  # the lowest slot moving into a cell wins it
        occupied = ((target.unsqueeze(2) == pos.unsqueeze(1)) & self.others).any(2)
        s["pos"] = torch.where(acts & (kind == EMPTY) & ~occupied, target, pos)

        # Extractors: +1 of the resource when ready and below the cap, then cool down.
        using_ext = acts & (kind >= EXTRACTOR) & (kind < ASSEMBLER)
        slot = torch.where(using_ext, s["ext_of_cell"].gather(1, target), self.num_extractors)
        resource = (kind.long() - EXTRACTOR).clamp_(0, NUM_RESOURCES - 1).unsqueeze(-1)
        held = inv.gather(2, resource).squeeze(-1)
        gain = using_ext & (cooldown.gather(1, slot) == 0) & (held < self.inventory_cap)
        inv.scatter_add_(2, resource, gain.unsqueeze(-1).to(inv.dtype))
        # Only gaining users are unique per extractor; everyone else writes the scratch slot X.
        cooldown.scatter_(1, torch.where(gain, slot, self.num_extractors), self.extractor_cooldown)

        # Assembler: one of each resource -> a heart. Chest: deposit all hearts.
        craft = (
            acts & (kind == ASSEMBLER) & (inv[..., :NUM_RESOURCES] > 0).all(-1) & (inv[..., HEART] < self.inventory_cap)
        )
        inv[..., :NUM_RESOURCES] -= craft.unsqueeze(-1).to(inv.dtype)
        inv[..., HEART] += craft.to(inv.dtype)
        deposit = torch.where(acts & (kind == CHEST), inv[..., HEART], 0)
        inv[..., HEART] -= deposit

        deposited = deposit.sum(1, dtype=torch.float32)  # [E]
        rewards = (
            self.heart_reward * deposited.unsqueeze(1) + self.resource_reward * gain + self.heart_made_reward * craft
        )
        s["t"] += 1
        per_env = torch.stack([rewards.sum(1), torch.ones_like(deposited), craft.sum(1), deposited, gain.sum(1)], 1)
        s["ep"] += per_env
        done = s["t"] >= self.max_steps
        self._end_episodes(done)
        truncated = done.repeat_interleave(a)
        return self._output(rewards.view(-1), torch.zeros_like(truncated), truncated)

    def episode_stats(self) -> dict[str, torch.Tensor]:
        """Sums over the env-episodes that ended since the last call, as 0-d float32 tensors on the device.

        ``episodes``: number of ended env-episodes; ``return``: sum over those episodes of the episode return
        averaged over the env's agents (divide by ``episodes`` for the mean per-agent return); ``length``: sum of
        episode lengths in steps; ``hearts_made`` / ``hearts_deposited`` / ``resources_gathered``: sums over all
        agents of the env. Staggered first episodes are shorter and count like any other. Resets the sums; no
        host sync.
        """
        totals = self.state["totals"].clone()
        totals[1] /= self.agents_per_env
        self.state["totals"].zero_()
        return {name: totals[i] for i, name in enumerate(STAT_NAMES)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every state tensor (cloned) plus the generator state under ``rng_state``: plain tensors only."""
        d = {k: v.clone() for k, v in self.state.items()}
        d["rng_state"] = self.generator.get_state()
        d["reset_capacity"] = torch.tensor(self._reset_capacity)
        return d

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        """Restore a ``state_dict`` of an env built with the same settings."""
        for k, v in self.state.items():
            if k not in d or d[k].shape != v.shape:
                raise ValueError(f"state_dict entry {k!r} is missing or has the wrong shape")
            v.copy_(d[k])
        self.generator.set_state(d["rng_state"])
        self._reset_capacity = int(d["reset_capacity"])

    # ------------------------------------------------------------------------------------------------ internals
    def _check_actions(self, actions: torch.Tensor) -> torch.Tensor:
        if not isinstance(actions, torch.Tensor):
            raise ValueError(f"actions must be a torch.Tensor, got {type(actions).__name__}")
        if actions.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"actions must be int64 (or int32), got {actions.dtype}")
        if actions.shape != (self.num_agents,):
            raise ValueError(f"actions must have shape [{self.num_agents}] (num_agents), got {list(actions.shape)}")
        actions = actions.to(self.device, torch.int64)
        in_range = (actions >= 0) & (actions < self.num_actions)
        msg = f"action ids must be in [0, {self.num_actions})"
        # An asynchronous assert: no host read on any device. On CPU it fails at once, so it becomes a ValueError
        # there; on an accelerator it surfaces at the next sync as a device-side assert carrying the message.
        try:
            torch._assert_async(in_range.all(), msg)
        except RuntimeError:
            raise ValueError(msg) from None
        return actions

    def _start_all(self) -> None:
        e = self.num_envs
        idx = torch.arange(e, device=self.device)
        t0 = torch.randperm(e, generator=self.generator, device=self.device) % self.max_steps
        self._start_episodes(idx, self.sampler.sample(e, self.generator), t0)
        self.state["ep"].zero_()
        self.state["totals"].zero_()
        self._reset_capacity = math.ceil(e / self.max_steps)

    def _end_episodes(self, done: torch.Tensor) -> None:
        """Add ended episodes to the totals and start new random episodes in those envs (done: bool [E])."""
        s = self.state
        done_f = done.to(torch.float32).unsqueeze(1)
        s["totals"][0] += done_f.sum()
        s["totals"][1:] += (s["ep"] * done_f).sum(0)
        s["ep"] *= 1.0 - done_f
        if not self.sync_free:
            idx = done.nonzero().squeeze(1)  # exact; a host sync, which costs nothing on CPU
            if idx.numel() == 0:
                return
            keep = None
        else:
            # A fixed number of envs: the ended ones first, in env order (stable sort), then others that keep their
            # state; the order is deterministic so that each ended env always draws the same layout.
            k = min(self._reset_capacity, self.num_envs)
            torch._assert_async(done.sum() <= k, "more envs ended in one step than the reset capacity")
            idx = torch.sort((~done).to(torch.uint8), stable=True).indices[:k]
            keep = ~done[idx]
        t0 = torch.zeros_like(idx)
        self._start_episodes(idx, self.sampler.sample(idx.numel(), self.generator), t0, keep)

    def _start_episodes(self, idx, lay: layouts.Layout, t0: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Write layout ``lay`` and empty agent state into envs ``idx`` (int64 [K]), except where ``keep`` is True."""
        s = self.state
        new = {
            "grid": lay.grid,
            "ext_pos": lay.ext_pos,
            "ext_of_cell": lay.ext_of_cell,
            "cell_types": torch.where(lay.grid != EMPTY, cell_token(F_TYPE, lay.grid.int()), 0),
            "cooldown": torch.zeros_like(s["cooldown"][idx]),
            "pos": lay.agent_pos,
            "inv": torch.zeros_like(s["inv"][idx]),
            "vibe": torch.zeros_like(s["vibe"][idx]),
            "t": t0,
        }
        if self.teacher:
            new["dist"] = distance_fields(lay.grid, self.inside, self.geom.pcols, self.sweeps)
        for name, value in new.items():
            if keep is not None:
                value = torch.where(keep.view(-1, *([1] * (value.dim() - 1))), s[name][idx], value)
            s[name].index_copy_(0, idx, value)

    def _output(self, rewards: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor) -> TensorDict:
        out = {keys.OBS: self._observe(), keys.REWARDS: rewards, keys.TERMINATED: terminated, keys.TRUNCATED: truncated}
        if self.teacher:
            s = self.state
            out[keys.TEACHER_ACTIONS] = teacher_actions(s["dist"], s["pos"], s["inv"], self.deltas)
        return TensorDict(out, batch_size=[self.num_agents], device=self.device)

    def _observe(self) -> torch.Tensor:
        """uint8 [N, M, 3] token observations of the current state (see tokens.py)."""
        s = self.state
        vibe, cooldown = s["vibe"].int(), s["cooldown"][:, : self.num_extractors].int()
        obj_pos = torch.cat([s["pos"], s["pos"], s["ext_pos"]], 1)  # [E, J]: agents' type, agents' vibe, cooldowns
        obj_tokens = torch.cat(
            [
                self.agent_type,
                torch.where(vibe > 0, cell_token(F_VIBE, vibe), 0),
                torch.where(cooldown > 0, cell_token(F_COOLDOWN, cooldown), 0),
            ],
            1,
        )
        progress = (s["t"] * 256 // self.max_steps).clamp_(max=255).int()
        centre = torch.cat([s["inv"].int(), progress.view(-1, 1, 1).expand(-1, self.agents_per_env, 1)], 2)
        return self.encoder.encode(s["cell_types"], s["pos"], centre.view(self.num_agents, -1), obj_pos, obj_tokens)
