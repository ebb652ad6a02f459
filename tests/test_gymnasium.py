"""env=gymnasium: the adapter on hand-made Gymnasium envs registered here (what the trainer stores, bootstrapping
of truncations, episode stats, seeding, refused spaces), and experiment=cartpole end to end."""

import json

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.env.gymnasium import GymnasiumEnv
from machina.errors import ConfigError
from machina.progress import Progress
from machina.startup.build import build
from tests.commands import run_script
from tests.conftest import compose_config

gymnasium = pytest.importorskip("gymnasium")  # the gym extra (part of dev)
spaces = gymnasium.spaces


class CountEnv(gymnasium.Env):
    """obs = [t, episode tag, 0] with t the steps taken in the episode and the tag drawn from the env's generator at
    reset; reward t + 0.5 * action after the step (t counted after it); terminates when t reaches ``term_at``."""

    metadata = {"render_modes": []}

    def __init__(self, term_at: int = 1_000, start: int = 0):
        self.observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = spaces.Discrete(2, start=start)
        self.term_at = term_at

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.tag = 0, float(self.np_random.uniform())
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), self.t + 0.5 * float(action), self.t >= self.term_at, False, {}

    def _obs(self):
        return np.array([self.t, self.tag, 0.0], dtype=np.float32)


class SpacesEnv(gymnasium.Env):
    """An env with the spaces it is given and nothing else: for the refusals."""

    def __init__(self, observation_space, action_space):
        self.observation_space, self.action_space = observation_space, action_space


COUNT = "machina-test/Count-v0"
gymnasium.register(COUNT, entry_point=CountEnv, max_episode_steps=7)
gymnasium.register("machina-test/Spaces-v0", entry_point=SpacesEnv)


def count_env(num_envs=3, seed=0, **kwargs) -> GymnasiumEnv:
    return GymnasiumEnv(COUNT, kwargs=kwargs, num_envs=num_envs, seed=seed)


def gym_config(*overrides):
    return compose_config(["experiment=cartpole", f"env.id={COUNT}", "wandb=disabled", *overrides])


def test_spec_and_step_contract():
    env = count_env()
    assert (env.spec.num_agents, env.spec.num_actions, env.spec.obs.size) == (3, 2, 3)
    assert not env.spec.observes_time and env.spec.outputs == frozenset()
    first = env.reset()
    assert first[keys.OBS].dtype == torch.float32 and first[keys.OBS].shape == (3, 3)
    out = env.step(torch.tensor([0, 1, 1]))
    assert out[keys.REWARDS].tolist() == [1.0, 1.5, 1.5]
    assert out[keys.OBS][:, 0].tolist() == [1.0, 1.0, 1.0]
    assert keys.FINAL_OBS not in out.keys()


def test_truncation_hands_the_final_observation_and_the_new_episode():
    env = count_env(num_envs=2)  # registered time limit: 7 steps
    tags = env.reset()[keys.OBS][:, 1].clone()
    for _ in range(6):
        out = env.step(torch.zeros(2, dtype=torch.int64))
        assert not out[keys.TRUNCATED].any() and keys.FINAL_OBS not in out.keys()
    out = env.step(torch.zeros(2, dtype=torch.int64))
    assert out[keys.TRUNCATED].all() and not out[keys.TERMINATED].any()
    assert out[keys.REWARDS].tolist() == [7.0, 7.0]  # the reward of the last action, on the step that ended it
    assert out[keys.FINAL_OBS][:, 0].tolist() == [7.0, 7.0] and torch.equal(out[keys.FINAL_OBS][:, 1], tags)
    assert out[keys.OBS][:, 0].tolist() == [0.0, 0.0]  # already the next episode's first observation
    assert not torch.equal(out[keys.OBS][:, 1], tags)


def test_an_end_that_is_both_terminal_and_a_time_limit_is_terminal():
    env = count_env(num_envs=1, term_at=7)
    env.reset()
    for _ in range(7):
        out = env.step(torch.zeros(1, dtype=torch.int64))
    assert out[keys.TERMINATED].tolist() == [True] and out[keys.TRUNCATED].tolist() == [False]
    assert keys.FINAL_OBS not in out.keys()  # nothing to bootstrap


def per_agent(x: torch.Tensor, num_agents: int) -> torch.Tensor:
    """Buffer rows [S, T, *rest] -> each agent's rollout in time order [N, S / N * T, *rest] (``agent_major`` with
    trailing feature dims)."""
    segments, horizon, *rest = x.shape
    passes = segments // num_agents
    return x.view(passes, num_agents, horizon, *rest).transpose(0, 1).reshape(num_agents, passes * horizon, *rest)


def test_rewards_and_ends_line_up_with_what_the_trainer_stores():
    """Each stored step: the observation acted on, its action, that action's reward and the episode end after it;
    truncated steps carry V(final observation), every other step 0."""
    parts = build(gym_config("env.num_envs=2", "+env.kwargs.term_at=5", "env.max_steps=4", "system.seed=3"))
    exp = parts.experience
    parts.rollout.run(Progress(0, 1))

    def stored(key):
        return per_agent(exp.buffer[key], parts.env.spec.num_agents)

    obs = stored(keys.OBS)
    t = obs[..., 0]
    actions, rewards = stored(keys.ACTIONS).float(), stored(keys.REWARDS)
    assert torch.equal(rewards, t + 1 + 0.5 * actions)
    assert torch.equal(stored(keys.TRUNCATED), t + 1 == 4)  # the time limit comes first (term_at=5)
    assert not stored(keys.TERMINATED).any()
    # The step after an end is the new episode's first observation.
    ended = (t + 1 == 4)[:, :-1]
    assert torch.equal(t[:, 1:][ended], torch.zeros(int(ended.sum())))

    truncated = stored(keys.TRUNCATED)
    final = obs[truncated].clone()
    final[:, 0] += 1  # the final observation: one step on, same episode tag
    policy = parts.policy.eval()
    with torch.no_grad():
        values = policy(TensorDict({keys.OBS: final.unsqueeze(1)}, batch_size=[len(final)]))[keys.VALUES][:, 0]
    assert torch.allclose(stored(keys.FINAL_VALUES)[truncated], values, atol=1e-6)
    assert torch.equal(stored(keys.FINAL_VALUES)[~truncated], torch.zeros(int((~truncated).sum())))


def test_terminations_are_stored_without_a_bootstrap():
    parts = build(gym_config("env.num_envs=2", "+env.kwargs.term_at=3"))
    parts.rollout.run(Progress(0, 1))
    buffer, n = parts.experience.buffer, parts.env.spec.num_agents
    terminated = per_agent(buffer[keys.TERMINATED], n)
    assert torch.equal(terminated, per_agent(buffer[keys.OBS], n)[..., 0] + 1 == 3)
    assert not per_agent(buffer[keys.FINAL_VALUES], n).any()


def test_episode_stats_and_last_episodes():
    env = count_env(num_envs=2, term_at=3)
    env.reset()
    for action in ([1, 0], [1, 0], [1, 0], [0, 0]):
        env.step(torch.tensor(action))
    stats = env.episode_stats()
    # Two episodes of 3 steps: returns 1.5 + 2.5 + 3.5 = 7.5 (action 1) and 6 (action 0).
    assert {k: v.item() for k, v in stats.items()} == {"episodes": 2.0, "return": 13.5, "length": 6.0}
    assert all(v.dtype == torch.float32 and v.dim() == 0 for v in stats.values())
    assert env.episode_stats()["episodes"].item() == 0.0  # the sums were reset
    last = env.last_episodes()
    assert last["episodes"].tolist() == [1.0, 1.0]
    assert last["return"].tolist() == [7.5, 6.0] and last["length"].tolist() == [3.0, 3.0]


def test_the_same_seed_plays_the_same_trajectory():
    def trajectory(seed, vectorizer="sync"):
        env = GymnasiumEnv("CartPole-v1", num_envs=2, seed=seed, vectorizer=vectorizer)
        gen = torch.Generator().manual_seed(0)
        obs = [env.reset()[keys.OBS]]
        for _ in range(60):  # a few episodes: later episodes follow from each env's own generator
            obs.append(env.step(torch.randint(0, 2, (2,), generator=gen))[keys.OBS])
        return torch.stack(obs)

    same = trajectory(1)
    assert torch.equal(same, trajectory(1))
    assert not torch.equal(same, trajectory(2))
    assert torch.equal(same, trajectory(1, vectorizer="async"))


def test_a_restored_env_keeps_its_counters_and_starts_new_episodes():
    env = count_env(num_envs=2, term_at=2)
    env.reset()
    for _ in range(4):
        env.step(torch.zeros(2, dtype=torch.int64))
    restored = count_env(num_envs=2, term_at=2)
    restored.load_state_dict(env.state_dict())
    assert restored.episode_stats()["episodes"].item() == 4.0
    assert restored.observe()[keys.OBS][:, 0].tolist() == [0.0, 0.0]
    assert not torch.equal(restored.observe()[keys.OBS], count_env(num_envs=2).observe()[keys.OBS])


def test_a_discrete_space_that_does_not_start_at_zero_is_shifted():
    env = count_env(num_envs=1, start=-1)
    assert env.spec.num_actions == 2 and env.action_start == -1
    assert env.step(torch.tensor([0]))[keys.REWARDS].tolist() == [0.5]  # action -1: 1 + 0.5 * -1


@pytest.mark.parametrize(
    ("observation_space", "action_space", "message"),
    [
        (spaces.Dict({"x": spaces.Box(0, 1, (2,))}), spaces.Discrete(2), "observation space Dict("),
        (spaces.Box(0, 255, (8, 8, 3), np.uint8), spaces.Discrete(2), "observation space Box(0, 255, (8, 8, 3)"),
        (spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (1,)), "action space Box(-1.0, 1.0, (1,)"),
        (spaces.Box(-1, 1, (3,)), spaces.MultiDiscrete([2, 2]), "action space MultiDiscrete"),
    ],
)
def test_unsupported_spaces_are_refused_naming_the_space(observation_space, action_space, message):
    kwargs = {"observation_space": observation_space, "action_space": action_space}
    with pytest.raises(ConfigError, match="is not supported") as err:
        GymnasiumEnv("machina-test/Spaces-v0", kwargs=kwargs, num_envs=1)
    assert message in str(err.value) and "env.id=machina-test/Spaces-v0" in str(err.value)


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="env.id=NoSuchEnv-v0"):
        GymnasiumEnv("NoSuchEnv-v0")
    with pytest.raises(ConfigError, match="env.vectorizer"):
        GymnasiumEnv("CartPole-v1", vectorizer="threads")


def test_a_loss_that_reads_teacher_actions_is_refused_by_the_builder_with_one_line():
    with pytest.raises(ConfigError) as refused:
        build(gym_config("losses=[ppo,supervisor]"))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "loss 'supervisor' reads the env output teacher_actions, which env machina.env.gymnasium.GymnasiumEnv does "
        "not declare (its optional outputs: none)"
    )
    assert "losses.supervisor.enabled=false" in message


def test_render_draws_an_rgb_frame_where_the_env_can():
    frame = GymnasiumEnv("CartPole-v1", num_envs=2).render(1)
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    with pytest.raises(NotImplementedError, match="cannot render"):
        count_env().render(0)


def test_policy_mlp_is_cleanrls_agent():
    policy = build(gym_config()).policy
    actor, critic = policy.actor.net, policy.critic.net
    assert [type(m).__name__ for m in actor] == ["Linear", "Tanh", "Linear", "Tanh", "Linear"]
    assert [m.out_features for m in critic if isinstance(m, torch.nn.Linear)] == [64, 64, 1]
    assert policy.state_keys == ()  # feed-forward
    # Orthogonal output layers: singular values equal to the gain (0.01 actor, 1.0 critic).
    assert torch.allclose(torch.linalg.svdvals(actor[-1].weight), torch.tensor(0.01), atol=1e-6)
    assert torch.allclose(torch.linalg.svdvals(critic[-1].weight), torch.tensor(1.0), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_steps_arrive_on_the_accelerator_through_pinned_memory():
    env = GymnasiumEnv(COUNT, num_envs=2, device="cuda")
    assert env.host[keys.OBS].is_pinned()
    for _ in range(7):
        out = env.step(torch.ones(2, dtype=torch.int64, device="cuda"))
    assert out[keys.OBS].is_cuda and out[keys.FINAL_OBS][:, 0].tolist() == [7.0, 7.0]
    assert out[keys.REWARDS].tolist() == [7.5, 7.5]


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_experiment_cartpole_trains_and_evaluates(tmp_path):
    run_dir = tmp_path / "run"
    result = run_script(
        "train.py", "experiment=cartpole", "trainer.total_timesteps=2048", "wandb=disabled", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 0, result.output[-3000:]
    rows = metrics(run_dir)
    assert [r["metric/agent_step"] for r in rows] == [512, 1024, 1536, 2048]
    assert all(r["env/episodes"] > 0 and r["overview/reward"] == r["env/return"] for r in rows)
    out = tmp_path / "eval"
    evaluated = run_script("eval.py", f"checkpoint={run_dir}", "episodes=4", f"hydra.run.dir={out}")
    assert evaluated.returncode == 0, evaluated.output[-3000:]
    result = json.loads((out / "eval.json").read_text())
    assert result["policy"]["episodes"] == 4 and result["policy"]["return"] > 0
    assert (out / "replay.gif").stat().st_size > 0


@pytest.mark.slow
def test_experiment_cartpole_reaches_cleanrls_return(tmp_path):
    """CleanRL's ppo.py reaches 488.75 +- 18.40 at 500k steps; machina's preset must reach a mean of >= 475."""
    run_dir = tmp_path / "run"
    result = run_script(
        "train.py", "experiment=cartpole", "system.seed=1", "wandb=disabled", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode == 0, result.output[-3000:]
    rows = metrics(run_dir)
    assert rows[-1]["metric/agent_step"] <= 500_000
    # The last 10 epochs in which episodes ended (null in the others: a CartPole episode lasts up to 500 steps).
    last = [r["overview/reward"] for r in rows if r["overview/reward"] is not None][-10:]
    assert sum(last) / len(last) >= 475
