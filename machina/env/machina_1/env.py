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
With ``stagger`` (training) each env starts its first episode at a random step counter in [0, max_steps), drawn as
a random permutation modulo max_steps, so first-episode lengths lie in [1, max_steps] and at most
ceil(num_envs / max_steps) envs end on any one step; without it (evaluation) every env starts at step 0.

How a step stays cheap (about 140 aten ops at any num_envs) and capturable in a CUDA graph: every env's state is
a row in each of two int64 blocks (``rows.py``, ``pool.py``), ended envs are reset by copying rows from a pool of
fresh episodes (one fixed-size gather per block) that ``prepare_rollout`` refills between rollouts, observations
and the teacher are table lookups into buffers allocated once (``tokens.py``, ``teacher.py``), and nothing is
read back to the host. Randomness comes only from one ``torch.Generator`` seeded from ``seed`` on ``device``, used
by ``reset`` and ``prepare_rollout``, never by ``step``.

Capturing ``step`` in a CUDA graph (``torch.cuda.graph``, after a few warm-up steps on a side stream as for any
capture): shapes and buffers are fixed and no host sync happens, so the capture succeeds; the step draws no random
numbers, so the env's generator needs no ``CUDAGraph.register_generator_state`` (a random draw added to ``step``
from ``self.generator``, a CUDA generator of its own, would need ``graph.register_generator_state(env.generator)``
before the capture, or every replay would repeat the captured draws). ``reset`` and ``prepare_rollout`` stay outside
the graph. A replay skips the step's Python side effects: pass the number of replayed steps to
``prepare_rollout(steps)``. The returned copies become the graph's static outputs, which every replay overwrites.
Invalid action ids trip an asynchronous device-side assert, inside a graph too.
"""

import sys
from collections.abc import Collection

import numpy as np
import torch
from tensordict import TensorDict

from machina import checks, keys
from machina.env.base import Capturable, Configurable, Env, Renderable
from machina.env.machina_1 import layout as layouts
from machina.env.machina_1.grid import (
    ASSEMBLER,
    CHEST,
    EMPTY,
    EXTRACTOR,
    HEART,
    INVENTORY_SLOTS,
    NUM_RESOURCES,
    WINDOW,
    Geometry,
    feature_table,
)
from machina.env.machina_1.obs import TokenEncoder
from machina.env.machina_1.pool import EpisodePool, Episodes
from machina.env.machina_1.settings import check_settings
from machina.env.machina_1.step_buffers import StepBuffers
from machina.env.machina_1.teacher import Teacher
from machina.env.spec import EnvSpec, ObsSpec
from machina.errors import ConfigError
from machina.files import saved_state

assert sys.byteorder == "little", "tokens are packed into int32s and read back as bytes (little-endian)"

STAT_NAMES = ("episodes", "return", "length", "hearts_made", "hearts_deposited", "resources_gathered")
NUM_MOVES = 5  # noop + 4 directions; vibe actions follow


class Machina1Env(Env, Capturable, Configurable, Renderable):
    """E envs x A agents of the machina_1 re-creation. See the module docstring for the rules.

    ``state`` maps names to views of the per-env rows (all int64 on ``device``; P = cells of one padded board,
    X = 4 * extractors_per_resource): ``grid`` [E, P] object types, ``ext_of_cell`` [E, P] extractor slot of each
    cell (X elsewhere), ``ext_pos`` [E, X], ``pos`` [E, A], ``inv`` [E, A, 5] (4 resources, hearts), ``vibe``
    [E, A], ``cooldown`` [E, X + 1] (the last slot belongs to no extractor and is never ready), ``t`` [E] step
    counter of the episode, ``ep`` [E, 5] this episode's counts (``Episodes.COUNTS``) and, with the teacher,
    ``dist`` int16 [E, P, 8] distance fields (teacher.py).

    Capabilities (``machina.env.base``): ``Capturable`` (``step`` replays from a CUDA graph, module docstring; and so
    ``Resumable``: a restored env continues its episodes exactly), ``Configurable`` (``region_size``,
    ``inventory_cap``), ``Renderable``.

    Every step writes into buffers allocated once; ``step``, ``reset`` and ``observe`` return copies of them, which
    the caller owns (losses keep a step across the next one, so handing out the buffers themselves would let the
    next step change what they hold).

    Args:
        agents_per_env: A, the cogs of one env (a team).
        height, width: the interior's size; the map adds a one-cell wall border.
        num_envs: E, the envs stepped together.
    """

    def __init__(
        self,
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
        region_size: int | None = None,
        num_envs: int = 256,
        seed: int = 0,
        device: str | torch.device = "cpu",
        outputs: Collection[str] = frozenset(),
        stagger: bool = True,
    ):
        check_settings(locals())
        teacher = keys.TEACHER_ACTIONS in outputs
        self.device = torch.empty(0, device=device).device  # with its index, so that device checks compare equal
        e, a, dev = num_envs, agents_per_env, self.device
        self.num_envs, self.agents_per_env, self.num_agents = e, a, e * a
        self.max_steps, self.teacher, self.stagger = max_steps, teacher, stagger
        self.rewards_per = (heart_reward, heart_made_reward, resource_reward)
        self.geom = Geometry(height, width)
        self.sampler = layouts.LayoutSampler(self.geom, a, extractors_per_resource, obstacle_density, dev)
        self.sampler.set_region(region_size)
        self.num_extractors = x = self.sampler.num_extractors

        names, norms = feature_table(extractor_cooldown, num_vibes, inventory_cap)
        self.num_actions = NUM_MOVES + num_vibes
        # The episode_progress token tells the policy how far the episode is: a time-limit end is observed. The
        # scripted teacher is there whether or not this env was asked to compute it (``outputs``).
        obs_spec = ObsSpec(max_tokens, WINDOW, names, norms)
        declared = frozenset({keys.TEACHER_ACTIONS})
        self.spec = EnvSpec(e, a, self.num_actions, obs_spec, declared, observes_time=True)

        self.generator = torch.Generator(dev)
        self.generator.manual_seed(seed)
        self.episodes = Episodes(self.geom, self.sampler, max_steps, teacher, self.generator)
        self.rows = self.episodes.empty(e)
        self.state = self.episodes.views(self.rows)
        self.pool = EpisodePool(self.episodes, size=e, num_envs=e)
        self.totals = torch.zeros(len(Episodes.COUNTS), dtype=torch.int64, device=dev)  # of ended episodes
        self.last = torch.zeros(e, len(Episodes.COUNTS), dtype=torch.int64, device=dev)  # each env's last episode
        self.ended = torch.zeros(e, dtype=torch.int64, device=dev)  # episodes ended per env since reset

        self._constants(extractor_cooldown, inventory_cap, num_vibes)
        self._buffers()
        views = {**self.state, "cooldown": self.cooldown_ext, "things": self.things}
        type_tokens = self.episodes.formats["map"].start["type_token_words"]
        self.encoder = TokenEncoder(self.geom, max_tokens, max_steps, views, self.rows["map"], type_tokens)
        if teacher:
            self.teacher_policy = Teacher(self.state["dist_words"], self.state["pos"], self.state["inv"], self.deltas)
        self.reset()

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
        for block, fresh in self.episodes.fresh(lay).items():
            self.rows[block][env_index] = fresh[0]
        self.pool.set_capacity(self.num_envs)  # hand-made episodes end out of the stagger's schedule

    def reset(self) -> TensorDict:
        """New random layouts for all envs (step counters staggered if ``stagger``), a refilled pool, cleared
        episode stats. Returns ``observe()``."""
        e = self.num_envs
        for block, fresh in self.episodes.fresh(self.sampler.sample(e, self.generator)).items():
            self.rows[block].copy_(fresh)
        if self.stagger:
            self.state["t"].copy_(torch.randperm(e, generator=self.generator, device=self.device) % self.max_steps)
        self.pool.set_capacity(-(-e // self.max_steps) if self.stagger else e)
        self.pool.refill()
        self.steps_since_refill = 0
        for stats in (self.totals, self.last, self.ended):
            stats.zero_()
        return self.observe()

    def prepare_rollout(self, steps: int | None = None) -> None:
        """Refill the pool of fresh episodes for the next ``steps`` steps (see ``pool.py``): layout generation and
        the teacher's distance fields happen here, between rollouts, never inside ``step``. ``steps`` defaults to
        the number of ``step`` calls since the last refill (the last rollout's length); a caller that replays steps
        without calling ``step`` (a captured CUDA graph) passes it."""
        self.pool.refill(self.steps_since_refill if steps is None else steps)
        self.steps_since_refill = 0

    def settings(self) -> dict[str, object]:
        """``region_size``: the side of the square of the interior that new layouts fill, the rest walled off
        (None: the whole interior; ``layout.LayoutSampler``). ``inventory_cap``: the most of each item an agent can
        gather or craft to, at most the cap the env was built with (which sets the observation's inventory norms)."""
        return {"region_size": self.sampler.region, "inventory_cap": self.cap_now}

    def configure(self, **settings: object) -> None:
        """Change ``settings()`` between rollouts (a curriculum). ``region_size`` takes effect at the next
        ``prepare_rollout``, which regenerates every pool row the rollout can take: every episode that starts from
        then on uses it, the episodes under way finish on their maps. ``inventory_cap`` takes effect at the next step,
        in every episode. No random draw happens here, so a resumed run that re-applies its stage continues exactly
        like the uninterrupted one."""
        unknown = sorted(set(settings) - set(self.settings()))
        if unknown:
            raise ConfigError(
                f"Machina1Env cannot change {unknown} during training; a curriculum may change "
                f"{sorted(self.settings())}"
            )
        if "region_size" in settings:
            self.sampler.set_region(settings["region_size"])
        if "inventory_cap" in settings:
            cap = settings["inventory_cap"]
            if not checks.is_integer(cap) or not 1 <= cap <= self.inventory_cap:
                raise ConfigError(
                    f"env.inventory_cap={cap!r} during training must be an integer in 1..{self.inventory_cap} (the "
                    "cap the env was built with, which sets the observation's inventory norms)"
                )
            # A tensor filled in place, so that a step captured in a CUDA graph reads the new cap too. Agents holding
            # more keep it; they cannot gather or craft more of that item until they are below the cap.
            self.cap.fill_(cap)
            self.cap_now = cap

    def observe(self) -> TensorDict:
        """The current observation TensorDict (zero rewards, no episode ends), as ``reset`` returns it."""
        return self._output(self.zero_rewards, self.never)

    def step(self, actions: torch.Tensor) -> TensorDict:
        """Advance every env by one step.

        actions: int64 (or int32) [N] with ids in [0, num_actions). Returns a TensorDict, batch [N]: OBS uint8
        [N, M, 3], REWARDS float32 [N], TERMINATED bool [N] (always False), TRUNCATED bool [N], and TEACHER_ACTIONS
        int64 [N] when built with it in ``outputs``. For envs whose episode ended at this step, REWARDS / TRUNCATED
        describe the step that just finished while OBS (and TEACHER_ACTIONS) already belong to the first step of the
        new episode.
        """
        s, w = self.state, self.work
        act = self._check_actions(actions)
        self.steps_since_refill += 1
        torch.where(act >= NUM_MOVES, act - NUM_MOVES, s["vibe"], out=s["vibe"])

        # Moves: an agent is blocked by a cell another agent starts the step on, and by a lower slot that moves
        # into (or uses) the same cell; unblocked agents enter empty cells and use objects.
        torch.take(self.action_delta, act, out=w.delta)
        torch.add(s["pos"], w.delta, out=w.target)
        w.start.copy_(s["pos"])
        torch.eq(w.target3, w.claims3, out=w.clash)
        torch.amax(w.clash.mul_(self.clash_rule), 2, out=w.free)
        w.free.eq_(0)  # 1 where not blocked
        torch.gather(s["grid"], 1, w.target, out=w.kind)
        torch.eq(w.kind, EMPTY, out=w.walk)
        s["pos"].addcmul_(w.delta, w.walk.mul_(w.free))

        # Extractors: +1 of the resource when ready and below the cap, then cool down.
        torch.maximum(self.cooldown_ext.sub_(1), self.zero, out=self.cooldown_ext)
        torch.gather(s["ext_of_cell"], 1, w.target, out=w.slot)
        torch.gather(s["cooldown"], 1, w.slot, out=w.gain).eq_(0)  # ready; never on the last slot (no extractor)
        torch.take(self.resource_slot, w.kind, out=w.resource)
        torch.gather(s["inv"], 2, w.resource3, out=w.room3).lt_(self.cap)
        w.gain.mul_(w.room).mul_(w.free)
        s["inv"].scatter_add_(2, w.resource3, w.gain3)
        s["cooldown"].scatter_reduce_(1, w.slot, torch.mul(w.gain, self.extractor_cooldown, out=w.cool), "amax")

        # Assembler: one of each resource -> a heart. Chest: deposit all hearts.
        torch.minimum(self.held[0], self.held[1], out=w.has_all)  # a chain, not amin: faster on 4 strided values
        for held in self.held[2:]:
            torch.minimum(w.has_all, held, out=w.has_all)
        torch.minimum(w.has_all, self.one, out=w.has_all)
        torch.lt(self.hearts, self.cap, out=w.room)
        torch.eq(w.kind, ASSEMBLER, out=w.craft).mul_(w.free).mul_(w.has_all).mul_(w.room)
        s["inv"].addcmul_(w.craft3, self.recipe)
        torch.eq(w.kind, CHEST, out=w.deposit).mul_(w.free).mul_(self.hearts)
        self.hearts.sub_(w.deposit)

        # Rewards, looked up by (hearts deposited in the env, what the agent did); episode counts; episode ends.
        torch.sum(w.events, 1, out=w.env_events)
        torch.add(w.gain, w.craft, alpha=2, out=w.reward_index).add_(w.env_deposited, alpha=3)
        torch.take(self.reward_table, w.reward_index, out=self.rewards_ea)
        self.episode_events.add_(w.env_events)
        self.clock.add_(1)
        torch.ge(s["t"], self.max_steps, out=w.done)
        self.truncated_ea.copy_(w.done_ea)
        self._end_episodes()
        return self._output(self.rewards, self.truncated)

    def episode_stats(self) -> dict[str, torch.Tensor]:
        """Sums over the env-episodes that ended since the last call, as 0-d float32 tensors on the device.

        ``episodes``: number of ended env-episodes; ``return``: sum over those episodes of the episode return
        averaged over the env's agents (divide by ``episodes`` for the mean per-agent return); ``length``: sum of
        episode lengths in steps; ``hearts_made`` / ``hearts_deposited`` / ``resources_gathered``: sums over all
        agents of the env. Staggered first episodes are shorter and count like any other. Resets the sums; no
        host sync.
        """
        stats = self._stats(self.totals.unsqueeze(0))
        self.totals.zero_()
        return {name: value[0] for name, value in stats.items()}

    def last_episodes(self) -> dict[str, torch.Tensor]:
        stats = self._stats(self.last)
        stats["episodes"] = self.ended.float()
        return stats

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What resume needs, as plain tensors: the envs' maps (object types of the bordered maps, uint8) and
        agents, the pool's maps and cursor, the episode stats, the generator and the steps since the last refill.
        Derived data (the teacher's distance fields, the type-token and extractor-slot boards) is recomputed by
        ``load_state_dict``: about 230 KB at 256 envs."""
        return {
            **self.episodes.save(self.rows),
            **self.pool.state_dict(),
            "totals": self.totals.clone(),
            "last": self.last.clone(),
            "ended": self.ended.clone(),
            "rng_state": self.generator.get_state(),
            "steps_since_refill": torch.tensor(self.steps_since_refill),
        }

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        """Restore a ``state_dict`` of an env built with the same settings; the teacher may be on in one and off in
        the other (its distance fields are recomputed when this env has the teacher). Every entry is checked before
        anything changes (ConfigError naming it): valid layouts and step counters (``Episodes.check``); inventories
        up to ``inventory_cap``, vibes below ``num_vibes``, extractor cooldowns up to ``extractor_cooldown`` with the
        no-extractor slot at 1; counts >= 0; a generator state of this device; and no more envs ending on one step
        (envs with the same step counter) than the pool's reset capacity, which a step asserts."""
        e, a, x = self.num_envs, self.agents_per_env, self.num_extractors
        rows = self.episodes.load(d, e)  # checked and built, not yet applied
        saved_state.tensor(d, "inv", (e, a, INVENTORY_SLOTS), torch.int64, 0, self.inventory_cap)
        saved_state.tensor(d, "vibe", (e, a), torch.int64, 0, self.num_actions - NUM_MOVES - 1)
        cooldown = saved_state.tensor(d, "cooldown", (e, x + 1), torch.int64, 0, self.extractor_cooldown)
        saved_state.values(cooldown[:, x], f"cooldown[:, {x}] (the no-extractor slot)", 1, 1)
        stats = {"totals": self.totals, "last": self.last, "ended": self.ended}
        saved = {name: saved_state.tensor(d, name, tuple(own.shape), torch.int64, 0) for name, own in stats.items()}
        rng_state = saved_state.tensor(d, "rng_state", tuple(self.generator.get_state().shape), torch.uint8)
        try:
            torch.Generator(self.device).set_state(rng_state)
        except RuntimeError as err:
            raise ConfigError(f"rng_state is not a generator state of {self.device} ({err})") from None
        steps = saved_state.tensor(d, "steps_since_refill", (), torch.int64, 0)
        capacity = int(saved_state.tensor(d, "reset_capacity", (), torch.int64, 1, e))
        together = int(torch.bincount(d["t"]).max())
        if together > capacity:
            raise ConfigError(f"t puts {together} envs at one step (they end together), reset_capacity is {capacity}")
        self.pool.load_state_dict(d)  # checks the pool's own entries before it changes
        for block, fresh in rows.items():
            self.rows[block].copy_(fresh)
        for name, own in stats.items():
            own.copy_(saved[name])
        self.generator.set_state(rng_state)
        self.steps_since_refill = int(steps)

    def render(self, env_index: int = 0, cell: int = 24) -> np.ndarray:
        """The replay frame of env ``env_index``: the map (``cell`` pixels per map cell) with a header (step, return
        and hearts so far) and a legend (see ``frame.py``), uint8 RGB [H, W, 3]."""
        from machina.env.machina_1.frame import draw_frame  # PIL is imported only where frames are drawn

        return draw_frame(self, env_index, cell)

    def episode_so_far(self, env_index: int) -> dict[str, float]:
        """This episode's stats of env ``env_index`` up to now (names of ``episode_stats``), read on the host."""
        return {k: float(v[0]) for k, v in self._stats(self.state["ep"][env_index : env_index + 1]).items()}

    # ------------------------------------------------------------------------------------------------ internals
    def _constants(self, extractor_cooldown: int, inventory_cap: int, num_vibes: int) -> None:
        dev, a, x = self.device, self.agents_per_env, self.num_extractors
        self.extractor_cooldown, self.inventory_cap = extractor_cooldown, inventory_cap
        self.cap_now, self.cap = inventory_cap, torch.tensor(inventory_cap, device=dev)  # a curriculum may lower it
        self.deltas = self.geom.move_deltas(dev)
        self.action_delta = torch.cat([self.deltas, self.deltas.new_zeros(num_vibes)])  # int64 [num_actions]
        self.max_action = torch.tensor(self.num_actions - 1, device=dev)
        slots = torch.arange(a, device=dev)
        # clash_rule[i, j]: agent i is blocked if its target is the target of a lower slot j (first A columns) or
        # the start cell of another agent j (last A columns).
        lower, others = slots.view(1, -1) < slots.view(-1, 1), slots.view(1, -1) != slots.view(-1, 1)
        self.clash_rule = torch.cat([lower, others], 1).unsqueeze(0).long()  # [1, A, 2A]
        self.zero, self.one = torch.tensor(0, device=dev), torch.tensor(1, device=dev)
        # Inventory slot of the resource of each object type (any slot for the others: they never gain).
        self.resource_slot = (torch.arange(EXTRACTOR + NUM_RESOURCES + 2, device=dev) - EXTRACTOR).clamp(0, 3)
        self.recipe = torch.tensor([-1] * NUM_RESOURCES + [1], device=dev)  # inventory change of a craft
        # Reward of (hearts deposited in the env d, agent event c: 0 none, 1 gathered, 2 crafted) at 3 * d + c, in
        # float32 and in the order of the reward's definition: heart + gathering + crafting.
        heart, made, resource = self.rewards_per
        deposited = torch.arange(a * inventory_cap + 1, device=dev, dtype=torch.float32).repeat_interleave(3)
        event = torch.arange(3, device=dev).repeat(a * inventory_cap + 1)
        self.reward_table = heart * deposited + resource * (event == 1) + made * (event == 2)
        self.cooldown_ext = self.state["cooldown"][:, :x]
        self.held = self.state["inv"][..., :NUM_RESOURCES].unbind(-1)
        self.hearts = self.state["inv"][..., HEART]
        episode, fields = self.rows["episode"], self.episodes.formats["episode"]
        self.things = episode[:, fields.span("ext_pos", "pos")]  # the extractors' cells, then the agents'
        self.clock = episode[:, self.episodes.clock]  # the step counter and the episode length: +1 per step
        self.episode_events = self.state["ep"][:, Episodes.COUNTS.index("hearts_made") :]

    def _buffers(self) -> None:
        """Output buffers and step scratch, allocated once: a step keeps every shape."""
        e, a, dev = self.num_envs, self.agents_per_env, self.device
        n = e * a
        self.rewards = torch.zeros(n, device=dev)
        self.zero_rewards = torch.zeros(n, device=dev)
        self.truncated = torch.zeros(n, dtype=torch.bool, device=dev)
        self.never = torch.zeros(n, dtype=torch.bool, device=dev)  # TERMINATED: episodes end by time only
        self.rewards_ea, self.truncated_ea = self.rewards.view(e, a), self.truncated.view(e, a)
        self.work = StepBuffers(e, a, dev)

    def _check_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """int64 [E, A] actions; a ValueError for a wrong type or shape, an asynchronous assert for ids out of range."""
        if not isinstance(actions, torch.Tensor):
            raise ValueError(f"actions must be a torch.Tensor, got {type(actions).__name__}")
        if actions.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"actions must be int64 (or int32), got {actions.dtype}")
        if actions.shape != (self.num_agents,):
            raise ValueError(f"actions must have shape [{self.num_agents}] (num_agents), got {list(actions.shape)}")
        if actions.dtype != torch.int64 or actions.device != self.device:
            actions = actions.to(self.device, torch.int64)
        act = actions.view(self.num_envs, self.agents_per_env)
        w = self.work
        # a | (n - 1 - a) is negative exactly when a < 0 or a > n - 1.
        torch.bitwise_or(act, torch.sub(self.max_action, act, out=w.check), out=w.check)
        msg = f"action ids must be in [0, {self.num_actions})"
        # An asynchronous assert: no host read on any device. On CPU it fails at once, so it becomes a ValueError
        # there; on an accelerator it surfaces at the next sync as a device-side assert carrying the message.
        try:
            torch._assert_async(w.check.amin() >= 0, msg)
        except RuntimeError:
            raise ValueError(msg) from None
        return act

    def _end_episodes(self) -> None:
        """Count the ended episodes (``work.done``) and start the ended envs afresh from the pool."""
        s, w = self.state, self.work
        w.done_i.copy_(w.done)
        torch.mul(s["ep"], w.done_i1, out=w.ended)
        self.totals.add_(w.ended.sum(0))
        torch.where(w.done1, s["ep"], self.last, out=self.last)
        self.ended.add_(w.done_i)
        self.pool.reset_ended(self.rows, w.done_i, w.done1)

    def _output(self, rewards: torch.Tensor, truncated: torch.Tensor) -> TensorDict:
        """The step's TensorDict: a new observation and copies of the other output buffers (class docstring)."""
        out = {keys.REWARDS: rewards, keys.TERMINATED: self.never, keys.TRUNCATED: truncated}
        if self.teacher:
            out[keys.TEACHER_ACTIONS] = self.teacher_policy.actions()
        out = {keys.OBS: self.encoder.encode(), **{k: v.clone() for k, v in out.items()}}
        return TensorDict(out, batch_size=[self.num_agents], device=self.device)

    def _stats(self, counts: torch.Tensor) -> dict[str, torch.Tensor]:
        """float32 [K] per stat name from episode counts int64 [K, 5] (``Episodes.COUNTS``); ``return`` is the
        episode return averaged over the env's agents, from its definition: every agent gets ``heart_reward`` per
        heart deposited, the gatherer and the crafter their shaping reward."""
        c = dict(zip(Episodes.COUNTS, counts.double().unbind(1), strict=True))
        heart, made, resource = self.rewards_per
        per_agent = heart * c["hearts_deposited"]
        per_agent = per_agent + (made * c["hearts_made"] + resource * c["resources_gathered"]) / self.agents_per_env
        return {name: (per_agent if name == "return" else c[name]).float() for name in STAT_NAMES}
