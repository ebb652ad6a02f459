"""The four teacher losses on hand-made minibatches and rollout steps: values, gradients, no input mutation."""

import math

import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.errors import ConfigError
from machina.losses.base import Progress
from machina.losses.eer_cloner import EERClonerLoss
from machina.losses.eer_kickstarter import EERKickstarterLoss
from machina.losses.schedule import Linear
from machina.losses.sliced_scripted_cloner import SlicedScriptedClonerLoss
from machina.losses.supervisor import SupervisorLoss

PROGRESS = Progress(0, 100)
A = 5


def log_probs(b=2, t=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, A, generator=g, requires_grad=True)
    return logits, logits.log_softmax(-1)


def test_supervisor_is_mean_teacher_nll_and_grads_reach_logits():
    logits, lp = log_probs()
    teacher = torch.tensor([[0, 1, 2], [3, 4, 0]])
    mb = TensorDict({keys.TEACHER_ACTIONS: teacher}, batch_size=[2, 3])
    before = mb.clone()
    terms = SupervisorLoss(action_loss_coef=2.0)(mb, TensorDict({keys.FULL_LOG_PROBS: lp}, [2, 3]), PROGRESS)
    direct = -torch.stack([lp[b, t, teacher[b, t]] for b in range(2) for t in range(3)]).mean()
    torch.testing.assert_close(terms["loss_supervised"], 2.0 * direct)
    agree = (lp.argmax(-1) == teacher).float().mean()
    torch.testing.assert_close(terms["teacher_agreement"], agree)
    terms["loss_supervised"].backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert (mb == before).all()


def test_supervisor_teacher_led_rollout_executes_teacher_but_keeps_policy_actions():
    n = 1000
    step = TensorDict(
        {keys.ACTIONS: torch.zeros(n, dtype=torch.long), keys.TEACHER_ACTIONS: torch.ones(n, dtype=torch.long)}, [n]
    )
    torch.manual_seed(0)
    SupervisorLoss(teacher_led_proportion=0.3).on_rollout_step(step, PROGRESS)
    assert torch.all(step[keys.ACTIONS] == 0)
    share = step[keys.ENV_ACTIONS].float().mean().item()
    assert 0.25 < share < 0.35
    quiet = TensorDict({keys.ACTIONS: torch.zeros(4, dtype=torch.long)}, [4])
    SupervisorLoss(teacher_led_proportion=0.0).on_rollout_step(quiet, PROGRESS)
    assert keys.ENV_ACTIONS not in quiet.keys()


def test_schedule_anneals_the_coefficient():
    sched = Linear(start=1.0, end=0.0, end_step=100)
    assert sched(0) == 1.0 and sched(50) == 0.5 and sched(500) == 0.0
    _, lp = log_probs()
    mb = TensorDict({keys.TEACHER_ACTIONS: torch.zeros(2, 3, dtype=torch.long)}, [2, 3])
    loss = SupervisorLoss(action_loss_coef=sched)
    out = TensorDict({keys.FULL_LOG_PROBS: lp}, [2, 3])
    early = loss(mb, out, Progress(0, 100))["loss_supervised"]
    late = loss(mb, out, Progress(50, 100))["loss_supervised"]
    torch.testing.assert_close(late, early * 0.5)
    with pytest.raises(ValueError, match="end_step > begin_step"):
        Linear(start=1, end=0, end_step=0)


def test_sliced_cloner_slices_rollout_and_loss():
    n = 3000
    torch.manual_seed(1)
    full = torch.randn(n, A).log_softmax(-1)
    actions = torch.zeros(n, dtype=torch.long)
    teacher = torch.full((n,), 3)
    step = TensorDict(
        {
            keys.ACTIONS: actions,
            keys.ACT_LOG_PROB: full[:, 0],
            keys.FULL_LOG_PROBS: full,
            keys.TEACHER_ACTIONS: teacher,
        },
        [n],
    )
    loss = SlicedScriptedClonerLoss(student_led_proportion=0.2, teacher_led_proportion=0.3)
    loss.on_rollout_start(PROGRESS)
    loss.on_rollout_step(step, PROGRESS)
    s, t, p = step[keys.STUDENT_MASK], step[keys.TEACHER_MASK], step[keys.PPO_MASK]
    assert torch.all(s.int() + t.int() + p.int() == 1)
    assert 0.17 < s.float().mean() < 0.23 and 0.27 < t.float().mean() < 0.33
    # Teacher-led agents store and execute the teacher's action, with its log-prob; others keep the policy's.
    assert torch.all(step[keys.ACTIONS][t] == 3) and torch.all(step[keys.ACTIONS][~t] == 0)
    torch.testing.assert_close(step[keys.ACT_LOG_PROB][t], full[t, 3])
    assert torch.equal(step[keys.ENV_ACTIONS], step[keys.ACTIONS])
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
    terms = loss(mb, TensorDict({keys.FULL_LOG_PROBS: lp}, [2, 2]), PROGRESS)
    torch.testing.assert_close(terms["loss_cloning"], -(lp[0, 0, 1] + lp[0, 1, 2]) / 2)
    assert float(terms["ppo_fraction"]) == 0.5


def test_eer_cloner_shapes_reward_by_previous_agreement():
    loss = EERClonerLoss(r_lambda=0.5, teacher_prob_floor=0.1)
    first = TensorDict(
        {
            keys.ACTIONS: torch.tensor([1, 2]),
            keys.TEACHER_ACTIONS: torch.tensor([1, 3]),
            keys.REWARDS: torch.zeros(2),
        },
        [2],
    )
    loss.on_rollout_step(first, PROGRESS)
    assert torch.all(first[keys.REWARDS] == 0)  # no previous step yet
    second = TensorDict(
        {
            keys.ACTIONS: torch.tensor([0, 0]),
            keys.TEACHER_ACTIONS: torch.tensor([0, 0]),
            keys.REWARDS: torch.tensor([1.0, 1.0]),
        },
        [2],
    )
    loss.on_rollout_step(second, PROGRESS)
    torch.testing.assert_close(second[keys.REWARDS], torch.tensor([1.0, 1.0 + 0.5 * math.log(0.1)]))

    _, lp = log_probs()
    teacher = torch.zeros(2, 3, dtype=torch.long)
    terms = loss(
        TensorDict({keys.TEACHER_ACTIONS: teacher}, [2, 3]), TensorDict({keys.FULL_LOG_PROBS: lp}, [2, 3]), PROGRESS
    )
    torch.testing.assert_close(terms["loss_cloning"], -lp[..., 0].mean())


def test_eer_cloner_rejects_a_bad_floor():
    with pytest.raises(ValueError, match="teacher_prob_floor"):
        EERClonerLoss(teacher_prob_floor=0.0)


def test_eer_kickstarter_loss_values():
    loss = EERKickstarterLoss.__new__(EERKickstarterLoss)
    EERKickstarterLoss.__init__(loss, teacher_checkpoint="unused.pt", action_loss_coef=0.6, value_loss_coef=2.0)
    logits, lp = log_probs()
    teacher_lp = torch.randn(2, 3, A).log_softmax(-1)
    values = torch.randn(2, 3, requires_grad=True)
    teacher_values = torch.randn(2, 3)
    mb = TensorDict({keys.TEACHER_FULL_LOG_PROBS: teacher_lp, keys.TEACHER_VALUES: teacher_values}, [2, 3])
    terms = loss(mb, TensorDict({keys.FULL_LOG_PROBS: lp, keys.VALUES: values}, [2, 3]), PROGRESS)
    ce = -(lp.exp() * teacher_lp).sum(-1).mean()
    torch.testing.assert_close(terms["loss_action"], 0.6 * ce)
    torch.testing.assert_close(terms["loss_value"], 2.0 * ((teacher_values - values) ** 2).mean())
    (terms["loss_action"] + terms["loss_value"]).backward()
    assert logits.grad.abs().sum() > 0 and values.grad.abs().sum() > 0


def test_eer_kickstarter_without_checkpoint_is_refused():
    with pytest.raises(ConfigError, match="teacher_checkpoint=PATH"):
        EERKickstarterLoss()
