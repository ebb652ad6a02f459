"""The four teacher losses on hand-made minibatches and rollout steps: values, gradients, no input mutation."""

import math

import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.errors import ConfigError
from machina.losses.eer_cloner import EERClonerLoss
from machina.losses.eer_kickstarter import EERKickstarterLoss
from machina.losses.sliced_scripted_cloner import SlicedScriptedClonerLoss
from machina.losses.supervisor import SupervisorLoss
from machina.progress import Progress
from machina.schedules import Linear

PROGRESS = Progress(0, 100)
A = 5


def log_probs(b=2, t=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, A, generator=g, requires_grad=True)
    return logits, logits.log_softmax(-1)


def test_supervisor_is_mean_teacher_nll_and_grads_reach_logits():
    logits, lp = log_probs()
    teacher = torch.tensor([[0, 1, 2], [3, 4, 0]])
    mb = TensorDict({keys.TEACHER_ACTIONS: teacher, keys.PRIO_WEIGHTS: torch.ones(2, 3)}, batch_size=[2, 3])
    before = mb.clone()
    terms = SupervisorLoss(action_loss_coef=2.0)(mb, TensorDict({keys.FULL_LOG_PROBS: lp}, [2, 3]), PROGRESS)
    direct = -torch.stack([lp[b, t, teacher[b, t]] for b in range(2) for t in range(3)]).mean()
    torch.testing.assert_close(terms["loss_supervised"], 2.0 * direct)
    agree = (lp.argmax(-1) == teacher).float().mean()
    torch.testing.assert_close(terms["teacher_agreement"], agree)
    terms["loss_supervised"].backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert (mb == before).all()


def rollout_step(n: int, seed: int = 0) -> TensorDict:
    """A rollout step after the policy acted: sampled actions and their log-probs, plus the teacher's actions."""
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(n, A, generator=g).log_softmax(-1)
    actions = torch.zeros(n, dtype=torch.long)
    return TensorDict(
        {
            keys.ACTIONS: actions,
            keys.ACT_LOG_PROB: full[:, 0],
            keys.FULL_LOG_PROBS: full,
            keys.TEACHER_ACTIONS: torch.full((n,), 3),
        },
        [n],
    )


def test_supervisor_teacher_led_agents_store_execute_and_train_on_the_teachers_action():
    n = 1000
    step = rollout_step(n)
    full = step[keys.FULL_LOG_PROBS].clone()
    torch.manual_seed(0)
    SupervisorLoss(teacher_led_proportion=0.3).on_rollout_step(step, PROGRESS)
    led = step[keys.ACTIONS] == 3
    assert 0.25 < led.float().mean() < 0.35 and torch.all(step[keys.ACTIONS][~led] == 0)
    # The stored log-probability is the policy's log-probability of the action that will be executed.
    torch.testing.assert_close(step[keys.ACT_LOG_PROB], full.gather(-1, step[keys.ACTIONS].unsqueeze(-1)).squeeze(-1))
    # ...which the policy did not sample: the step is marked for PPO to leave out of its policy terms.
    assert torch.equal(step[keys.TEACHER_LED], led)
    quiet = rollout_step(4)
    never = SupervisorLoss(teacher_led_proportion=0.0)
    never.on_rollout_step(quiet, PROGRESS)
    assert torch.all(quiet[keys.ACTIONS] == 0)
    assert keys.TEACHER_LED not in quiet.keys() and keys.TEACHER_LED not in never.experience_spec(None)


def test_supervisor_marks_no_step_once_its_schedule_reaches_zero():
    """A schedule positive early stores ``TEACHER_LED`` for the whole run, all False where it is 0."""
    loss = SupervisorLoss(teacher_led_proportion=Linear(start=1.0, end=0.0, end_step=100))
    assert loss.experience_spec(None)[keys.TEACHER_LED] == ((), torch.bool)
    early, late = rollout_step(8), rollout_step(8)
    loss.on_rollout_step(early, Progress(0, 200))
    loss.on_rollout_step(late, Progress(150, 200))
    assert torch.all(early[keys.TEACHER_LED]) and torch.all(early[keys.ACTIONS] == 3)
    assert not torch.any(late[keys.TEACHER_LED]) and torch.all(late[keys.ACTIONS] == 0)


def test_schedule_anneals_the_coefficient():
    sched = Linear(start=1.0, end=0.0, end_step=100)
    assert sched(0) == 1.0 and sched(50) == 0.5 and sched(500) == 0.0
    _, lp = log_probs()
    mb = TensorDict(
        {keys.TEACHER_ACTIONS: torch.zeros(2, 3, dtype=torch.long), keys.PRIO_WEIGHTS: torch.ones(2, 3)}, [2, 3]
    )
    loss = SupervisorLoss(action_loss_coef=sched)
    out = TensorDict({keys.FULL_LOG_PROBS: lp}, [2, 3])
    early = loss(mb, out, Progress(0, 100))["loss_supervised"]
    late = loss(mb, out, Progress(50, 100))["loss_supervised"]
    torch.testing.assert_close(late, early * 0.5)
    with pytest.raises(ConfigError, match="^end_step=0 must be above begin_step=0"):
        Linear(start=1, end=0, end_step=0)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="^action_loss_coef="):
            SupervisorLoss(action_loss_coef=bad)


def test_sliced_cloner_slices_rollout_and_loss():
    n = 3000
    torch.manual_seed(1)
    step = rollout_step(n, seed=1)
    full = step[keys.FULL_LOG_PROBS].clone()
    loss = SlicedScriptedClonerLoss(student_led_proportion=0.2, teacher_led_proportion=0.3)
    loss.on_rollout_start(PROGRESS)
    loss.on_rollout_step(step, PROGRESS)
    s, t, p = step[keys.STUDENT_MASK], step[keys.TEACHER_MASK], step[keys.PPO_MASK]
    assert torch.all(s.int() + t.int() + p.int() == 1)
    assert 0.17 < s.float().mean() < 0.23 and 0.27 < t.float().mean() < 0.33
    # Teacher-led agents store and execute the teacher's action, with its log-prob; others keep the policy's.
    assert torch.all(step[keys.ACTIONS][t] == 3) and torch.all(step[keys.ACTIONS][~t] == 0)
    torch.testing.assert_close(step[keys.ACT_LOG_PROB][t], full[t, 3])
    # The masks stay fixed for the whole rollout.
    masks = s.clone()
    loss.on_rollout_step(step, PROGRESS)
    assert torch.equal(step[keys.STUDENT_MASK], masks)

    logits, lp = log_probs(2, 2)
    mb = TensorDict(
        {
            keys.TEACHER_ACTIONS: torch.tensor([[1, 2], [3, 4]]),
            keys.STUDENT_MASK: torch.tensor([[True, False], [False, False]]),
            keys.TEACHER_MASK: torch.tensor([[False, True], [False, False]]),
            keys.PPO_MASK: torch.tensor([[False, False], [True, True]]),
        },
        [2, 2],
    )
    mb[keys.PRIO_WEIGHTS] = torch.tensor([[1.0, 0.5], [1.0, 1.0]])
    terms = loss(mb, TensorDict({keys.FULL_LOG_PROBS: lp}, [2, 2]), PROGRESS)
    # Importance weights count: mean over the two cloned samples of w * nll.
    torch.testing.assert_close(terms["loss_cloning"], -(lp[0, 0, 1] + 0.5 * lp[0, 1, 2]) / 2)
    assert float(terms["ppo_fraction"]) == 0.5


@pytest.mark.parametrize(
    ("student", "teacher"),
    [(0.6, 0.5), (-0.1, 0.2), (0.2, Linear(start=0.2, end=0.9, end_step=100))],
)
def test_sliced_cloner_refuses_proportions_that_leave_no_room(student, teacher):
    with pytest.raises(ValueError, match="sum to at most 1"):
        SlicedScriptedClonerLoss(student_led_proportion=student, teacher_led_proportion=teacher)


def test_eer_cloner_shapes_the_reward_of_each_action_by_its_agreement():
    loss = EERClonerLoss(r_lambda=0.5, teacher_prob_floor=0.1)
    step = TensorDict(
        {
            keys.ACTIONS: torch.tensor([1, 2]),
            keys.TEACHER_ACTIONS: torch.tensor([1, 3]),
            keys.REWARDS: torch.tensor([1.0, 1.0]),
        },
        [2],
    )
    loss.on_env_step(step, PROGRESS)
    # r_t += r_lambda * log pi_T(a_t | s_t), the teacher as 1 on its action and the floor elsewhere.
    torch.testing.assert_close(step[keys.REWARDS], torch.tensor([1.0, 1.0 + 0.5 * math.log(0.1)]))

    _, lp = log_probs()
    teacher = torch.zeros(2, 3, dtype=torch.long)
    mb = TensorDict({keys.TEACHER_ACTIONS: teacher, keys.PRIO_WEIGHTS: torch.ones(2, 3)}, [2, 3])
    terms = loss(mb, TensorDict({keys.FULL_LOG_PROBS: lp}, [2, 3]), PROGRESS)
    torch.testing.assert_close(terms["loss_cloning"], -lp[..., 0].mean())


def test_eer_cloner_rejects_a_bad_floor():
    with pytest.raises(ConfigError, match=r"^teacher_prob_floor=0.0 must be a number in \(0, 1\]"):
        EERClonerLoss(teacher_prob_floor=0.0)


def kickstarter(**kwargs) -> EERKickstarterLoss:
    return EERKickstarterLoss(teacher=torch.nn.Identity(), **kwargs)  # the loss terms read the stored teacher outputs


def test_eer_kickstarter_action_loss_is_the_reverse_kl_to_the_teacher():
    loss = kickstarter(action_loss_coef=0.6, value_loss_coef=2.0, r_lambda=0.0)
    logits, lp = log_probs()
    teacher_lp = torch.randn(2, 3, A).log_softmax(-1)
    values = torch.randn(2, 3, requires_grad=True)
    teacher_values = torch.randn(2, 3)
    mb = TensorDict(
        {
            keys.TEACHER_FULL_LOG_PROBS: teacher_lp,
            keys.TEACHER_VALUES: teacher_values,
            keys.PRIO_WEIGHTS: torch.ones(2, 3),
        },
        [2, 3],
    )
    terms = loss(mb, TensorDict({keys.FULL_LOG_PROBS: lp, keys.VALUES: values}, [2, 3]), PROGRESS)
    student = torch.distributions.Categorical(logits=lp.detach())
    kl = torch.distributions.kl_divergence(student, torch.distributions.Categorical(logits=teacher_lp)).mean()
    torch.testing.assert_close(terms["loss_action"].detach(), 0.6 * kl)
    torch.testing.assert_close(terms["loss_value"], 2.0 * ((teacher_values - values) ** 2).mean())
    (terms["loss_action"] + terms["loss_value"]).backward()
    assert logits.grad.abs().sum() > 0 and values.grad.abs().sum() > 0


def test_eer_kickstarter_loss_is_zero_exactly_when_student_and_teacher_agree():
    loss = kickstarter(r_lambda=0.0, value_loss_coef=0.0)
    _, lp = log_probs()
    weights = torch.ones(2, 3)
    same = TensorDict({keys.TEACHER_FULL_LOG_PROBS: lp.detach(), keys.TEACHER_VALUES: torch.zeros(2, 3)}, [2, 3])
    same[keys.PRIO_WEIGHTS] = weights
    policy_out = TensorDict({keys.FULL_LOG_PROBS: lp, keys.VALUES: torch.zeros(2, 3)}, [2, 3])
    assert abs(float(loss(same, policy_out, PROGRESS)["loss_action"].detach())) < 1e-6
    # A one-hot student on the teacher's mode minimises the seed's cross-entropy, but not the KL.
    mode = lp.detach().argmax(-1)
    one_hot = torch.full_like(lp, -30.0).scatter(-1, mode.unsqueeze(-1), 0.0).log_softmax(-1)
    collapsed = loss(same, TensorDict({keys.FULL_LOG_PROBS: one_hot, keys.VALUES: torch.zeros(2, 3)}, [2, 3]), PROGRESS)
    assert float(collapsed["loss_action"].detach()) > 0.1


def test_eer_kickstarter_drops_value_distillation_while_shaping_rewards():
    shaping = kickstarter(value_loss_coef=2.0, r_lambda=Linear(start=0.01, end=0.0, end_step=100))
    mb = TensorDict(
        {
            keys.TEACHER_FULL_LOG_PROBS: torch.zeros(1, 1, A).log_softmax(-1),
            keys.TEACHER_VALUES: torch.ones(1, 1),
            keys.PRIO_WEIGHTS: torch.ones(1, 1),
        },
        [1, 1],
    )
    out = TensorDict(
        {keys.FULL_LOG_PROBS: torch.zeros(1, 1, A).log_softmax(-1), keys.VALUES: torch.zeros(1, 1)}, [1, 1]
    )
    assert shaping(mb, out, Progress(0, 200))["value_coef"] == 0.0
    late = shaping(mb, out, Progress(150, 200))
    assert late["value_coef"] == 2.0 and float(late["loss_value"]) == 2.0
    step = TensorDict(
        {keys.ACTIONS: torch.tensor([1]), keys.TEACHER_FULL_LOG_PROBS: torch.log(torch.full((1, A), 0.2))}, [1]
    )
    step[keys.REWARDS] = torch.tensor([1.0])
    shaping.on_env_step(step, Progress(0, 200))
    torch.testing.assert_close(step[keys.REWARDS], torch.tensor([1.0 + 0.01 * math.log(0.2)]))


def test_eer_kickstarter_without_a_teacher_file_is_refused_naming_its_setting():
    from machina.startup.build import build_losses
    from tests.conftest import compose_config

    cfg = compose_config(["losses=[eer_kickstarter]"])
    with pytest.raises(ConfigError, match=r"^losses\.eer_kickstarter\.teacher\.path=None names no teacher: set it"):
        build_losses(cfg.losses)


def test_the_dagger_preset_anneals_the_teacher_led_share_to_zero():
    from machina.startup.build import build_losses
    from tests.conftest import compose_config

    cfg = compose_config(["experiment=machina_1_dagger"])
    supervisor = build_losses(cfg.losses)["supervisor"]
    end = cfg.losses.supervisor.teacher_led_proportion.end_step
    assert end < cfg.trainer.total_timesteps  # the student acts alone for the last part of training
    shares = [supervisor.teacher_led(step) for step in (0, end // 2, end, cfg.trainer.total_timesteps)]
    assert shares == pytest.approx([0.5, 0.25, 0.0, 0.0])
    assert cfg.learner.update_epochs == 3 and list(cfg.losses) == ["ppo", "supervisor"]
