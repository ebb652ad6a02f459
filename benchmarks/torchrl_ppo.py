"""A stock TorchRL 0.14 PPO loop on machina's ``machina_1`` env: the reference for issue 18's speed comparison.

    bash benchmarks/torchrl_env.sh                                   # once: makes .venv-torchrl/
    .venv-torchrl/bin/python benchmarks/torchrl_ppo.py [--iterations N] [--json]

What is measured: end-to-end agent steps per second over whole training iterations, after one warm-up iteration.
An iteration is what TorchRL's PPO recipes (sota-implementations/ppo) do per batch: the ``Collector`` steps the
env with the policy until it holds ``--batch`` agent steps, ``GAE`` computes advantages and value targets (its
value network runs over the observations and the next observations), the batch goes into a replay buffer, and one
epoch of ``--minibatch``-sample minibatches trains ``ClipPPOLoss`` with Adam. The clock reads once at the end of
every iteration, so collection, GAE and the update are all inside it and nothing falls between iterations.

The env is machina's own ``Machina1Env`` with its default settings (256 envs x 4 agents = 1,024 agents, 128 token
slots, 21 actions) and no teacher, wrapped as a TorchRL ``EnvBase`` of batch [1024] (``MachinaEnv``). The policy
is feed-forward: every token (location, feature, value) is hashed to one of 65,536 rows of an
``EmbeddingBag(65536, 64)`` (padding tokens weigh 0), then ReLU, Linear(64, 128), ReLU, shared by a linear actor
head (21 logits) and a linear critic head, as TorchRL's ``ActorValueOperator``. PPO's settings are machina's
(``PPO`` below, Adam at lr 1e-3); the minibatch is 16,384 samples as issue 18 states (machina's default: 8,192).
Everything else is TorchRL's default but one: ``GAE(shifted=True)``, TorchRL's own faster option (its default vmaps
the critic over the observations and the next ones, and vmap falls back to a Python loop for ``embedding_bag``).
As in TorchRL's PPO recipes, ``ClipPPOLoss`` runs the shared trunk once for the actor and once for the critic.
Torch runs as in machina's default experiment: non-deterministic algorithms, default thread count. Needs
.venv-torchrl (TorchRL 0.14.1 pins tensordict < 0.15, machina tensordict 0.15); machina itself is not installed
there: its env is imported from this repository, and it needs only torch and tensordict.
"""

import argparse
import json
import sys
import time
from itertools import pairwise
from pathlib import Path

import tensordict
import torch
import torchrl
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import Categorical as CategoricalDist
from torchrl.collectors import Collector
from torchrl.data import Bounded, Categorical, Composite, LazyTensorStorage, TensorDictReplayBuffer, Unbounded
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.envs import EnvBase
from torchrl.modules import ActorValueOperator, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # machina's env from this repo, not an install
from machina import keys  # noqa: E402
from machina.env.machina_1 import Machina1Env  # noqa: E402

PAD = 0xFF  # padding tokens are (0xFF, 0xFF, 0xFF); feature id 0xFF marks them
ROWS = 65536  # hashed embedding rows
# PPO as machina's default experiment sets it (conf/losses/ppo.yaml, conf/trainer/default.yaml, conf/optimizer).
PPO = {
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_epsilon": 0.2,
    "value_clip": 0.2,
    "entropy_coeff": 0.01,
    "critic_coeff": 0.5,
    "max_grad_norm": 0.5,
    "adam_eps": 1e-5,
}


class MachinaEnv(EnvBase):
    """TorchRL view of a ``Machina1Env``: batch [N] (N = all agents of all envs), one step steps every env.

    Writes ``observation`` uint8 [N, M, 3] (the env's own tensor, not copied), ``reward`` float32 [N, 1] and
    ``done`` / ``terminated`` / ``truncated`` bool [N, 1]; reads ``action`` int64 [N]. machina_1 ends episodes at
    ``max_steps`` and observes the episode's progress, so the time limit is part of the MDP and its end is reported
    as ``terminated`` (no bootstrap), as machina treats it. The env resets ended envs itself, inside ``step``: the
    collector's partial reset (``_reset`` mask) then only hands back the observation the step already returned.
    """

    def __init__(self, env: Machina1Env):
        n = env.num_agents
        super().__init__(batch_size=torch.Size([n]), device=env.device)
        self.env = env
        obs_shape = (n, env.spec.obs.max_tokens, 3)
        self.observation_spec = Composite(
            observation=Bounded(0, 255, obs_shape, dtype=torch.uint8, device=env.device), shape=(n,)
        )
        self.action_spec = Categorical(env.num_actions, shape=(n,), device=env.device)
        self.reward_spec = Unbounded(shape=(n, 1), device=env.device)
        flag = Categorical(2, shape=(n, 1), dtype=torch.bool, device=env.device)
        self.done_spec = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=(n,))
        self._no_end = torch.zeros(n, 1, dtype=torch.bool, device=env.device)
        self._obs = None

    def _reset(self, tensordict: TensorDict | None = None, **kwargs) -> TensorDict:
        if tensordict is None or "_reset" not in tensordict.keys() or self._obs is None:
            self._obs = self.env.reset()[keys.OBS]
        ends = {"done": self._no_end, "terminated": self._no_end, "truncated": self._no_end}
        return TensorDict({"observation": self._obs, **ends}, batch_size=self.batch_size, device=self.device)

    def _step(self, tensordict: TensorDict) -> TensorDict:
        out = self.env.step(tensordict["action"])
        self._obs = out[keys.OBS]
        ended = out[keys.TRUNCATED].unsqueeze(-1)
        return TensorDict(
            {
                "observation": self._obs,
                "reward": out[keys.REWARDS].unsqueeze(-1),
                "done": ended,
                "terminated": ended,
                "truncated": self._no_end,
            },
            batch_size=self.batch_size,
            device=self.device,
        )

    def _set_seed(self, seed: int | None) -> None:
        """The env draws from its own generator, seeded when it is built (``--seed``)."""


class HashedTokenBag(nn.Module):
    """uint8 [..., M, 3] token observations -> float32 [..., hidden].

    Each token's 24-bit (location, feature, value) is hashed (Knuth's multiplicative hash, top 16 bits) into one
    of ``ROWS`` rows; an observation is the sum of its tokens' rows (padding weighs 0), then ReLU, Linear, ReLU.
    """

    def __init__(self, embed_dim: int, hidden: int):
        super().__init__()
        self.bag = nn.EmbeddingBag(ROWS, embed_dim, mode="sum")
        self.mlp = nn.Sequential(nn.ReLU(), nn.Linear(embed_dim, hidden), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        lead = obs.shape[:-2]
        tokens = obs.reshape(-1, obs.shape[-2], 3).long()
        key = (tokens[..., 0] << 16) | (tokens[..., 1] << 8) | tokens[..., 2]
        rows = ((key * 2654435761) >> 16) & (ROWS - 1)
        weights = (tokens[..., 1] != PAD).float()
        return self.mlp(self.bag(rows, per_sample_weights=weights)).reshape(*lead, -1)


def make_actor_critic(env: MachinaEnv, embed_dim: int, hidden: int):
    """A shared trunk with actor and critic heads, as TorchRL's PPO recipes build it."""
    trunk = TensorDictModule(HashedTokenBag(embed_dim, hidden), in_keys=["observation"], out_keys=["hidden"])
    logits = TensorDictModule(nn.Linear(hidden, env.env.num_actions), in_keys=["hidden"], out_keys=["logits"])
    actor_head = ProbabilisticActor(
        logits,
        in_keys=["logits"],
        spec=env.full_action_spec["action"],
        distribution_class=CategoricalDist,
        return_log_prob=True,
    )
    critic_head = ValueOperator(nn.Linear(hidden, 1), in_keys=["hidden"])
    model = ActorValueOperator(trunk, actor_head, critic_head)
    return model.get_policy_operator(), model.get_value_operator()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=3, help="measured iterations (after 1 warm-up)")
    parser.add_argument("--batch", type=int, default=65536, help="agent steps collected per iteration")
    parser.add_argument("--minibatch", type=int, default=16384, help="samples per minibatch (one epoch per batch)")
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object for the run")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(False)  # machina's default experiment: system.torch_deterministic=false
    env = MachinaEnv(Machina1Env(seed=args.seed))
    actor, critic = make_actor_critic(env, args.embed_dim, args.hidden)

    # The policy is feed-forward and needs no env transforms; False also silences 0.14's FutureWarning, which
    # asks for an InitTracker whatever the policy.
    collector = Collector(
        env,
        actor,
        frames_per_batch=args.batch,
        total_frames=args.batch * (1 + args.iterations),
        device="cpu",
        auto_register_policy_transforms=False,
    )
    # shifted=True: one critic call over the observations and the next ones together instead of vmap over the two,
    # which falls back to a Python loop for embedding_bag (14.5k vs 16.8k agent-steps/s here, 2026-12-01).
    advantage = GAE(gamma=PPO["gamma"], lmbda=PPO["gae_lambda"], value_network=critic, average_gae=False, shifted=True)
    loss_module = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=PPO["clip_epsilon"],
        entropy_coeff=PPO["entropy_coeff"],
        critic_coeff=PPO["critic_coeff"],
        loss_critic_type="l2",
        normalize_advantage=True,
        clip_value=PPO["value_clip"],
    )
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(args.batch), sampler=SamplerWithoutReplacement(), batch_size=args.minibatch
    )
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=args.lr, eps=PPO["adam_eps"])

    ends = []  # perf_counter at the end of each iteration
    for data in collector:
        with torch.no_grad():
            data = advantage(data)
        buffer.empty()
        buffer.extend(data.reshape(-1))
        for batch in buffer:
            losses = loss_module(batch)
            loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), PPO["max_grad_norm"])
            optimizer.step()
        collector.update_policy_weights_()
        ends.append(time.perf_counter())
    collector.shutdown()

    seconds = [b - a for a, b in pairwise(ends)]  # whole iterations after the warm-up one
    result = {
        "loop": "torchrl",
        "sps": args.batch * len(seconds) / sum(seconds),
        "iterations": len(seconds),
        "iteration_seconds": seconds,
        "settings": {
            "gae_shifted": True,
            "agents": env.env.num_agents,
            "batch": args.batch,
            "minibatch": args.minibatch,
            "epochs": 1,
            "embedding": [ROWS, args.embed_dim],
            "hidden": args.hidden,
            "lr": args.lr,
            **PPO,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
        },
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"torchrl PPO: {result['sps']:,.0f} agent-steps/s over {result['iterations']} iterations")
    return result


if __name__ == "__main__":
    main()
