"""``check_env``: an env against what the trainer relies on, in the spirit of Gymnasium's ``check_env`` and TorchRL's
``check_env_specs``. A user runs it in one line in their own tests::

    from machina.conformance.env import check_env

    def test_my_env():
        check_env(MyEnv, {"length": 5})

It plays random actions on the CPU (or ``device``) and checks, raising ``ConformanceError`` with one sentence that
says what to implement:

- the core (``machina.env.base.Env``): ``spec`` (an ``EnvSpec`` of the asked ``num_envs``), and what ``reset``,
  ``step`` and a ``Resumable`` env's ``observe`` return (a TensorDict of batch [N] on the env's device; ``OBS`` of
  the shape and dtype ``spec.obs`` describes, ``REWARDS`` float32 [N], ``TERMINATED`` / ``TRUNCATED`` bool [N];
  ``FINAL_OBS`` on exactly the steps that truncate when ``spec.observes_time`` is False, never when True; each
  optional output of ``spec.outputs`` when asked for and no other);
- episode statistics: ``episode_stats`` holds ``episodes``, ``return``, ``length`` as 0-d float32 tensors on the
  device and zeroes its sums on each call; ``last_episodes`` holds float32 [E] of the same names, whose
  ``episodes`` add up to the episodes ``episode_stats`` counted;
- capabilities (``machina.env.base.CAPABILITIES``): a declared one implements its methods, and methods of one that
  is not declared are refused (the trainer asks with ``isinstance`` and would never call them);
- ``Resumable``: ``state_dict`` is a dict of tensors; an env that ``continues_episodes`` gives it back unchanged
  after ``load_state_dict`` and continues bit-exactly in a restored copy (same actions, same outputs), one that
  does not (its load starts new episodes) starts the same new episodes in two copies restored from one state;
- ``Grouped`` (two groups or more): ``send`` / ``recv`` per group give what ``step`` gives;
- ``Configurable``: ``configure(**settings())`` is accepted and changes nothing; ``Renderable``: ``render(0)`` is
  uint8 RGB [H, W, 3] (or refuses with NotImplementedError where the env draws no frames).
"""

from collections.abc import Callable, Mapping
from contextlib import closing, contextmanager
from typing import Any

import numpy as np
import torch

from machina import keys
from machina.conformance.env_outputs import OUTCOMES, action_source, check_stats, check_step, fail
from machina.env.base import CAPABILITIES, Capturable, Configurable, Env, Grouped, Renderable, Resumable
from machina.env.spec import EnvSpec, ObsSpec, VectorObsSpec

CORE = ("reset", "step", "episode_stats", "last_episodes")
# Flags of the env interface before capabilities: an env that sets one meant to declare the capability.
FLAGS = {"continues_episodes": Resumable, "capturable": Capturable, "groups": Grouped, "host_processes": Grouped}


def check_env(
    env: type[Env] | Callable[..., Env],
    settings: Mapping[str, Any] | None = None,
    *,
    device: str | torch.device = "cpu",
    num_envs: int = 2,
    steps: int = 256,
    seed: int = 0,
) -> None:
    """Check an env; raise ``ConformanceError`` at the first thing the trainer could not rely on.

    Args:
        env: an env class, built as ``env(**settings, num_envs=, seed=, device=, outputs=, stagger=)``, or a
            ``make_env(seed=, num_envs=, stagger=, outputs=)`` (``machina.env.factory.env_factory``'s, which binds
            the settings and the device).
        settings: the class's own settings (``conf/env/<name>.yaml`` without ``_target_``); only with a class.
        device: where a class builds its env.
        num_envs: envs per built env; keep it small.
        steps: random-action steps played at most; an episode must end within them (the stats are checked on it).
        seed: the envs' seed and the random actions'.
    """
    make = maker(env, settings, device, num_envs)
    with closing(make(seed=seed)) as first:
        name = type(first).__name__
        check_declared(first, name)
        spec = check_spec(first, name, num_envs)
        actions = action_source(spec, first.device, seed)
        check_step(first.reset(), f"{name}.reset", first, frozenset(), first_step=True)
        check_episodes(first, name, actions, steps)
        if isinstance(first, Resumable):
            check_step(first.observe(), f"{name}.observe", first, frozenset(), first_step=True)
        if isinstance(first, Configurable):
            check_configure(first, name)
        if isinstance(first, Renderable):
            check_render(first, name)
        grouped = isinstance(first, Grouped) and first.groups > 1
        resumable = isinstance(first, Resumable)
    for output in sorted(spec.outputs):
        with closing(make(seed=seed, outputs=frozenset({output}))) as env:
            check_step(env.reset(), f"{name}.reset", env, frozenset({output}), first_step=True)
            for _ in range(2):
                check_step(env.step(actions()), f"{name}.step", env, frozenset({output}))
    if grouped:
        check_groups(make, name, spec, seed)
    if resumable:
        check_resume(make, name, spec, seed, steps)


def maker(env: type[Env] | Callable[..., Env], settings: Mapping | None, device, num_envs: int) -> Callable[..., Env]:
    """``make(seed=, outputs=, stagger=)`` -> a fresh env of ``num_envs`` envs."""
    if isinstance(env, type):
        own = dict(settings or {})
        return lambda seed, outputs=frozenset(), stagger=True: env(
            **own, num_envs=num_envs, seed=seed, device=str(device), outputs=outputs, stagger=stagger
        )
    if settings:
        raise TypeError("check_env: settings go with an env class; a make_env has its settings already")
    return lambda seed, outputs=frozenset(), stagger=True: env(
        seed=seed, num_envs=num_envs, outputs=outputs, stagger=stagger
    )


def check_declared(env: Env, name: str) -> None:
    """The core is implemented; each capability is declared exactly where its methods are."""
    if not isinstance(env, Env):
        fail(f"{name} is not a machina env: subclass machina.env.base.Env and implement {', '.join(CORE)}.")
    for method in CORE:
        if getattr(type(env), method) is getattr(Env, method):
            fail(f"{name} does not implement {method}: implement it (machina.env.base.Env, the required core).")
    for capability, methods in CAPABILITIES.items():
        own = [m for m in methods if hasattr(type(env), m) and getattr(type(env), m) is not getattr(capability, m)]
        title = f"machina.env.base.{capability.__name__}"
        if isinstance(env, capability) and len(own) < len(methods):
            missing = ", ".join(m for m in methods if m not in own)
            fail(f"{name} is {title} but does not implement {missing}: implement it, or drop it from the bases.")
        if not isinstance(env, capability) and methods and len(own) == len(methods):
            fail(
                f"{name} implements {', '.join(methods)} but is not {title}, so the trainer never calls them: add "
                f"{capability.__name__} to its bases."
            )
    for flag, capability in FLAGS.items():
        if hasattr(env, flag) and not isinstance(env, capability):
            fail(
                f"{name} sets {flag} but is not machina.env.base.{capability.__name__}, so the trainer never reads "
                f"it: add {capability.__name__} to its bases."
            )


def check_spec(env: Env, name: str, num_envs: int) -> EnvSpec:
    spec = getattr(env, "spec", None)
    if not isinstance(spec, EnvSpec):
        fail(f"{name}.spec is {type(spec).__name__}: set it to a machina.env.spec.EnvSpec in the constructor.")
    if spec.num_envs != num_envs:
        fail(f"{name}.spec.num_envs is {spec.num_envs} for num_envs={num_envs}: build as many envs as num_envs asks.")
    if not isinstance(spec.obs, ObsSpec | VectorObsSpec):
        fail(f"{name}.spec.obs is {type(spec.obs).__name__}: describe observations with an ObsSpec or VectorObsSpec.")
    if not isinstance(getattr(env, "device", None), torch.device):
        fail(f"{name}.device is not a torch.device: set it in the constructor (torch.device(device)).")
    return spec


def check_episodes(env: Env, name: str, actions: Callable[[], torch.Tensor], steps: int) -> None:
    """Step until an episode ends (for an env that declares ``ACTIVE``: every agent of one env ended, those that
    finished earlier included), then check ``episode_stats`` and ``last_episodes`` on it."""
    for _ in range(steps):
        td = check_step(env.step(actions()), f"{name}.step", env, frozenset())
        done = td[keys.TERMINATED] | td[keys.TRUNCATED]
        if keys.ACTIVE in env.spec.outputs:  # agents finish one by one: an episode ends when all of an env's have
            done = done.view(env.spec.num_envs, env.spec.agents_per_env).all(1)
        if bool(done.any()):
            break
    else:
        fail(
            f"{name} ended no episode in {steps} steps of random actions: pass check_env a larger steps= or "
            "shorter episodes."
        )
    stats = check_stats(env.episode_stats(), f"{name}.episode_stats", env, ())
    if float(stats["episodes"]) <= 0:
        fail(f"{name}.episode_stats counts no episode after one ended: add each ended episode to its sums.")
    again = env.episode_stats()
    if any(bool(value.any()) for value in again.values()):
        fail(f"{name}.episode_stats does not reset its sums: zero them on each call.")
    last = check_stats(env.last_episodes(), f"{name}.last_episodes", env, (env.spec.num_envs,))
    if set(last) != set(stats):
        fail(f"{name}.last_episodes has {sorted(last)}, episode_stats {sorted(stats)}: report the same stat names.")
    if float(last["episodes"].sum()) != float(stats["episodes"]):
        fail(f"{name}.last_episodes' episodes do not add up to episode_stats': count each env's ended episodes alike.")


def check_configure(env: Env, name: str) -> None:
    settings = env.settings()
    if not isinstance(settings, dict):
        fail(f"{name}.settings returned {type(settings).__name__}: return a dict of setting names to values.")
    env.configure(**settings)
    if env.settings() != settings:
        fail(f"{name}.configure(**settings()) changed the settings: applying the current values must change nothing.")


def check_render(env: Env, name: str) -> None:
    try:
        frame = env.render(0)
    except NotImplementedError:
        return  # declared, but this env draws no frames (say why in the message): replays are refused at start-up
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        fail(f"{name}.render(0) is not a uint8 [H, W, 3] array: return an RGB frame as a numpy uint8 array.")


def check_groups(make: Callable[..., Env], name: str, spec: EnvSpec, seed: int) -> None:
    """Stepped group by group (send both, then receive both), a twin gives what ``step`` gives."""
    with closing(make(seed=seed)) as whole, closing(make(seed=seed)) as parts:
        whole.reset(), parts.reset()
        size = spec.num_agents // parts.groups
        actions = action_source(spec, whole.device, seed)
        for _ in range(4):
            act = actions()
            expected = whole.step(act)
            for g in range(parts.groups):
                parts.send(g, act[g * size : (g + 1) * size])
            for g in range(parts.groups):
                got, want = parts.recv(g), expected[g * size : (g + 1) * size]
                for key in (keys.OBS, *OUTCOMES):
                    if not torch.equal(got[key], want[key]):
                        fail(
                            f"{name}.recv({g}) differs from step in {key}: send / recv of a group must step it as "
                            "step does."
                        )


def check_resume(make: Callable[..., Env], name: str, spec: EnvSpec, seed: int, steps: int) -> None:
    """A restored copy round-trips ``state_dict`` and continues bit-exactly (``continues_episodes``), or two restored
    copies start the same new episodes."""
    actions = action_source(spec, torch.device("cpu"), seed)
    played = [actions() for _ in range(min(steps, 32))]
    with closing(make(seed=seed)) as original:
        original.reset()
        for act in played[: len(played) // 2]:
            original.step(act.to(original.device))
        state = original.state_dict()
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            fail(f"{name}.state_dict is not a dict of tensors: return plain tensors, which a checkpoint stores.")
        saved = {key: value.clone() for key, value in state.items()}
        rest = played[len(played) // 2 :]
        if original.continues_episodes:
            expected = continuation(original, rest, seed)
    with closing(make(seed=seed)) as restored:
        restored.load_state_dict({key: value.clone() for key, value in saved.items()})
        again = restored.state_dict()
        if original.continues_episodes and (
            set(again) != set(saved) or not all(torch.equal(again[k].cpu(), saved[k].cpu()) for k in saved)
        ):
            fail(
                f"{name}.state_dict after load_state_dict differs from the state loaded: restore every entry it saves."
            )
        got = continuation(restored, rest, seed)
    if not original.continues_episodes:
        with closing(make(seed=seed)) as twin:
            twin.load_state_dict({key: value.clone() for key, value in saved.items()})
            expected = continuation(twin, rest, seed)
    what = "continue the original" if original.continues_episodes else "start the same new episodes"
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        differs = sorted(
            k for k in set(want) | set(have) if k not in want or k not in have or not torch.equal(want[k], have[k])
        )
        if differs:
            step = "observe()" if i == 0 else f"step {i}"
            fail(
                f"{name}: a restored copy does not {what} ({step} differs in {', '.join(differs)}): save in "
                "state_dict everything reset and step read, and restore all of it in load_state_dict."
            )


def continuation(env: Env, actions: list[torch.Tensor], seed: int) -> list[dict[str, torch.Tensor]]:
    """``observe()`` then the steps of ``actions`` after ``prepare_rollout``, as CPU copies, under torch's RNG seeded
    with ``seed`` and deterministic algorithms (``system.torch_deterministic=true``)."""
    with deterministic(seed):
        out = [env.observe()]
        env.prepare_rollout(len(actions))
        out += [env.step(act.to(env.device)) for act in actions]
    return [{key: value.detach().cpu().clone() for key, value in td.items()} for td in out]


@contextmanager
def deterministic(seed: int):
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(was[0], warn_only=was[1])
