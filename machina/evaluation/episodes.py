"""Playing an env with an actor: step by step (``play``), or until every env has ended one episode
(``first_episodes``). Host reads are fine here: evaluation is not the training loop."""

from collections.abc import Iterator

import torch
from tensordict import TensorDict

from machina import keys
from machina.env.base import Env
from machina.evaluation.actors import Actor


def play(env: Env, actor: Actor) -> Iterator[TensorDict]:
    """Reset ``env``, then yield each step TensorDict [N] before ``actor`` acts on it, without end (the caller
    stops). ``EPISODE_START`` is set as the trainer sets it. The steps are the env's buffers: valid until the next
    one is yielded."""
    step = env.reset()
    step[keys.EPISODE_START] = torch.ones(env.spec.num_agents, device=env.device)
    while True:
        yield step
        step = env.step(actor(step))
        step[keys.EPISODE_START] = (step[keys.TERMINATED] | step[keys.TRUNCATED]).float()


def first_episodes(env: Env, actor: Actor, step_limit: int) -> dict[str, torch.Tensor]:
    """Play from a reset until every env has ended an episode, or for ``step_limit`` steps; return, for every env
    that ended one, the stats of its first episode (float32 [K] per name of ``env.last_episodes()`` but
    ``episodes``). Envs that end early play on, so that slow envs are not cut short; their later episodes are
    not counted, so that short episodes are not counted more often than long ones."""
    first: dict[str, torch.Tensor] = {}
    ended = torch.zeros(env.spec.num_envs, dtype=torch.bool, device=env.device)
    for steps, _ in enumerate(play(env, actor)):
        if steps > 0:
            last = env.last_episodes()
            new = (last.pop("episodes") > 0) & ~ended
            first = {k: torch.where(new, v, first.get(k, torch.zeros_like(v))) for k, v in last.items()}
            ended |= new
        if steps == step_limit or ended.all():
            break
    return {k: v[ended] for k, v in first.items()}
