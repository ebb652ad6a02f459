"""What the rollout stores is what happened: the action the env executed, the policy's log-probability of it, the
reward and episode end the env returned for it, for every loss combination that makes agents teacher-led."""

import pytest
import torch

from machina import keys
from machina.policy.inputs import rollout_input, training_input
from machina.startup.build import build, build_trainer
from machina.training.experience import agent_major
from tests.conftest import compose_config
from tests.test_checkpoint import teacher  # noqa: F401 (a fixture: a policy file for eer_kickstarter)

TINY = ["debug=tiny", "env.num_envs=8", "env.max_steps=12", "experience.bptt_horizon=8", "wandb=disabled"]
TEACHER_LED = [
    ["losses=[ppo,supervisor]", "losses.supervisor.teacher_led_proportion=0.5"],
    ["losses=[sliced_scripted_cloner,ppo]", "losses.sliced_scripted_cloner.teacher_led_proportion=0.4"],
    ["losses=[ppo,supervisor,eer_cloner]", "losses.supervisor.teacher_led_proportion=0.5"],
]


def recorded_rollout(overrides):
    """Run one rollout, recording every env.step's actions and results; return (trainer, actions, results)."""
    cfg = compose_config([*TINY, *overrides])
    parts = build(cfg)
    trainer = build_trainer(cfg, parts, sinks=[])
    env, executed, results = parts.env, [], []
    step = env.step

    def recording_step(actions):
        executed.append(actions.clone())
        result = step(actions)
        results.append(result.clone())
        return result

    env.step = recording_step
    trainer.rollout.run(trainer.progress)
    return trainer, torch.stack(executed, 1), results  # actions [N, steps]


@pytest.mark.parametrize("overrides", TEACHER_LED, ids=lambda o: o[0])
def test_every_stored_action_was_executed_with_the_policys_log_prob_of_it(overrides):
    trainer, executed, _ = recorded_rollout(overrides)
    buffer, n = trainer.learner.experience.buffer, trainer.learner.experience.num_agents
    assert torch.equal(agent_major(buffer[keys.ACTIONS], n), executed)
    teacher_actions = agent_major(buffer[keys.TEACHER_ACTIONS], n)
    led = (executed == teacher_actions) & (agent_major(buffer[keys.ACT_LOG_PROB], n) < -0.5)
    assert led.float().mean() > 0.1  # teacher-led steps happened (and they are among the executed actions)
    with torch.no_grad():
        trainer.learner.policy.eval()
        again = trainer.learner.policy(training_input(buffer, trainer.learner.experience.row_state))[keys.ACT_LOG_PROB]
    torch.testing.assert_close(buffer[keys.ACT_LOG_PROB], again, rtol=1e-4, atol=1e-5)


def test_each_step_stores_the_reward_and_episode_end_of_its_own_action():
    trainer, _, results = recorded_rollout(["losses=[ppo,supervisor]", "losses.supervisor.teacher_led_proportion=1.0"])
    buffer, n = trainer.learner.experience.buffer, trainer.learner.experience.num_agents
    for key in (keys.REWARDS, keys.TERMINATED, keys.TRUNCATED):
        want = torch.stack([r[key] for r in results], 1)
        assert torch.equal(agent_major(buffer[key], n), want), key
    rewards = agent_major(buffer[keys.REWARDS], n)
    assert rewards.sum() > 0  # the teacher gathers: rewards arrive and are stored with the step that earned them
    starts = agent_major(buffer[keys.EPISODE_START], n)
    ended = agent_major(buffer[keys.TERMINATED] | buffer[keys.TRUNCATED], n)
    assert torch.equal(starts[:, 1:].bool(), ended[:, :-1])  # an episode starts right after one ended
    # The bootstrap of every agent's last step: V of the observation the rollout ends on, with the state it ends in.
    with torch.no_grad():
        ending = trainer.learner.policy.act(rollout_input(trainer.rollout.step_td, trainer.rollout.state))[keys.VALUES]
    torch.testing.assert_close(trainer.learner.experience.last_values, ending)


ALL_HOOKS = ["losses=[ppo,supervisor,eer_cloner,eer_kickstarter]", "losses.supervisor.teacher_led_proportion=0.5"]


@pytest.mark.parametrize("hooks", [False, True], ids=["no hooks", "every hook"])
def test_no_inference_tensor_outlives_the_rollout_and_training_follows(hooks, request):
    """The rollout runs in inference mode; what it leaves behind (the buffer, the row states, the live step, the
    bootstrap values, the env's state) must be normal tensors, or the learner's backward would refuse them."""
    teacher_file = f"losses.eer_kickstarter.teacher.path={request.getfixturevalue('teacher')}"
    overrides = [*ALL_HOOKS, teacher_file] if hooks else ["losses=[ppo]"]
    trainer, _, _ = recorded_rollout(overrides)
    assert trainer.rollout.hooked == hooks
    exp = trainer.learner.experience
    left = {
        **{f"buffer/{k}": v for k, v in exp.buffer.items()},
        **{f"row_state/{k}": v for k, v in exp.row_state.items()},
        **{f"live/{k}": v for k, v in trainer.rollout.live.items()},
        "last_values": exp.last_values,
        **{f"env/{k}": v for k, v in trainer.rollout.env.state_dict().items()},
    }
    inference = [name for name, value in left.items() if value.is_inference()]
    assert not inference
    trainer.learner.policy.train()
    trainer.learner.run(trainer.progress)  # backward through the stored steps
    assert all(torch.isfinite(p).all() for p in trainer.learner.policy.parameters())


def test_what_hooked_losses_read_at_rollout_is_their_classes_consumes(monkeypatch):
    """The rollout keeps a policy output the buffer does not store only when a loss with rollout hooks consumes it
    (its class's ``consumes``, the one list): supervisor's teacher-led draws read full_log_probs; PPO has no hooks,
    so even an emitted full_log_probs is not kept for it, nor the entropy it consumes in training."""
    from machina.losses.supervisor import SupervisorLoss

    def kept(overrides):
        parts = build(compose_config([*TINY, *overrides]))
        assert keys.FULL_LOG_PROBS not in parts.experience.step_keys
        return parts.rollout.policy_keys

    teacher_led = ["losses=[ppo,supervisor]", "losses.supervisor.teacher_led_proportion=0.5"]
    assert keys.FULL_LOG_PROBS in kept(teacher_led)
    ppo_only = kept(["losses=[ppo]", "policy.action_probs.emit_full_log_probs=true"])
    assert keys.FULL_LOG_PROBS not in ppo_only and keys.ENTROPY not in ppo_only
    monkeypatch.setattr(SupervisorLoss, "consumes", frozenset({keys.VALUES}))  # no longer reads full_log_probs
    assert keys.FULL_LOG_PROBS not in kept([*teacher_led, "policy.action_probs.emit_full_log_probs=true"])
