"""The PPO loss on hand-made minibatches."""

import torch
from tensordict import TensorDict

from machina import keys
from machina.losses.ppo import PPOLoss
from machina.progress import Progress

PROGRESS = Progress(0, 100)


def batch(adv, old_logp, old_values, mask=None):
    shape = adv.shape
    td = TensorDict(
        {
            keys.ADVANTAGES: adv,
            keys.ACT_LOG_PROB: old_logp,
            keys.VALUES: old_values,
            keys.PRIO_WEIGHTS: torch.ones(shape),
        },
        batch_size=shape,
    )
    if mask is not None:
        td[keys.PPO_MASK] = mask
    return td


def out(logp, values, entropy):
    return TensorDict({keys.ACT_LOG_PROB: logp, keys.VALUES: values, keys.ENTROPY: entropy}, batch_size=logp.shape)


def test_on_policy_surrogate_is_minus_mean_advantage():
    adv = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    logp = torch.log(torch.full((2, 2), 0.3))
    loss = PPOLoss(norm_adv=False, ent_coef=0.0)
    terms = loss(batch(adv, logp, torch.zeros(2, 2)), out(logp, torch.zeros(2, 2), torch.ones(2, 2)), PROGRESS)
    torch.testing.assert_close(terms["loss_policy"], -adv.mean())
    assert float(terms["clipfrac"]) == 0.0
    assert abs(float(terms["approx_kl"])) < 1e-7


def test_clipping_and_clipfrac():
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 1.1, 0.5, 0.95]]))  # ratios 1.5, 1.1, 0.5, 0.95
    loss = PPOLoss(clip_coef=0.2, norm_adv=False, ent_coef=0.0)
    terms = loss(batch(adv, old, torch.zeros(1, 4)), out(new, torch.zeros(1, 4), torch.zeros(1, 4)), PROGRESS)
    # per element: max(-A r, -A clip(r)): A=1,r=1.5 -> -1.2; A=1,r=1.1 -> -1.1; A=-1,r=0.5 -> 0.8; A=-1,r=.95 -> .95
    expected = (-1.2 - 1.1 + 0.8 + 0.95) / 4
    torch.testing.assert_close(terms["loss_policy"], torch.tensor(expected))
    assert float(terms["clipfrac"]) == 0.5


def test_clipped_value_loss_and_coefficients():
    adv = torch.tensor([[1.0, 1.0]])  # returns = adv + old values = [1, 1]
    old_values = torch.zeros(1, 2)
    values = torch.tensor([[0.5, 2.0]])
    loss = PPOLoss(vf_coef=0.5, vf_clip_coef=0.2, norm_adv=False, ent_coef=0.1)
    entropy = torch.tensor([[1.0, 3.0]])
    terms = loss(batch(adv, torch.zeros(1, 2), old_values), out(torch.zeros(1, 2), values, entropy), PROGRESS)
    # element 0: unclipped (0.5-1)^2=.25, clipped value 0.2 -> (0.2-1)^2=.64 -> .64
    # element 1: unclipped (2-1)^2=1, clipped 0.2 -> .64 -> 1
    torch.testing.assert_close(terms["value_loss"], torch.tensor(0.5 * (0.64 + 1.0) / 2))
    torch.testing.assert_close(terms["loss_value"], 0.5 * terms["value_loss"])
    torch.testing.assert_close(terms["loss_entropy"], torch.tensor(-0.1 * 2.0))


def test_advantage_normalisation():
    adv = torch.tensor([[1.0, 3.0]])
    loss = PPOLoss(norm_adv=True, ent_coef=0.0)
    terms = loss(
        batch(adv, torch.zeros(1, 2), torch.zeros(1, 2)), out(torch.zeros(1, 2), *[torch.zeros(1, 2)] * 2), PROGRESS
    )
    # normalised advantages are [-1, 1]: mean is 0
    torch.testing.assert_close(terms["loss_policy"], torch.tensor(0.0), atol=1e-6, rtol=0)


def test_ppo_mask_restricts_the_loss_to_its_slice():
    adv = torch.tensor([[1.0, 5.0]])
    mask = torch.tensor([[1.0, 0.0]])
    loss = PPOLoss(norm_adv=False, ent_coef=0.0)
    terms = loss(batch(adv, torch.zeros(1, 2), torch.zeros(1, 2), mask), out(*[torch.zeros(1, 2)] * 3), PROGRESS)
    torch.testing.assert_close(terms["loss_policy"], torch.tensor(-1.0))


def test_gradients_flow_and_inputs_are_not_mutated():
    adv = torch.randn(3, 4)
    mb = batch(adv, torch.randn(3, 4), torch.randn(3, 4))
    before = mb.clone()
    logp = torch.randn(3, 4, requires_grad=True)
    values = torch.randn(3, 4, requires_grad=True)
    entropy = torch.rand(3, 4, requires_grad=True)
    terms = PPOLoss()(mb, out(logp, values, entropy), PROGRESS)
    sum(v for k, v in terms.items() if k.startswith("loss_")).backward()
    assert logp.grad is not None and values.grad is not None and entropy.grad is not None
    assert all(not v.requires_grad for k, v in terms.items() if not k.startswith("loss_"))
    assert (mb == before).all()


def test_importance_weights_scale_each_sample_once():
    """mean(w * term) over the samples: weights summing to less than the sample count lower the loss (no second
    normalisation by their sum)."""
    adv = torch.tensor([[2.0, -1.0]])
    weights = torch.tensor([[0.5, 0.25]])
    mb = batch(adv, torch.zeros(1, 2), torch.zeros(1, 2))
    mb[keys.PRIO_WEIGHTS] = weights
    loss = PPOLoss(norm_adv=False, ent_coef=1.0, clip_vloss=False)
    terms = loss(mb, out(torch.zeros(1, 2), adv, torch.ones(1, 2)), PROGRESS)
    torch.testing.assert_close(terms["loss_policy"], torch.tensor((0.5 * -2.0 + 0.25 * 1.0) / 2))
    torch.testing.assert_close(terms["loss_entropy"], torch.tensor(-(0.5 + 0.25) / 2))
    torch.testing.assert_close(terms["value_loss"], torch.tensor(0.0))  # values equal the returns


def test_normalisation_uses_the_masked_samples_only():
    """CleanRL: (A - A.mean()) / (A.std() + 1e-8) over the minibatch; here over PPO's slice."""
    adv = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[True, True, False]])
    logp = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.1, 1.1, 1.1]]))
    terms = PPOLoss(norm_adv=True, ent_coef=0.0)(
        batch(adv, logp, torch.zeros(1, 3), mask), out(new, *[adv] * 2), PROGRESS
    )
    normalised = (torch.tensor([1.0, 3.0]) - 2.0) / (torch.tensor([1.0, 3.0]).std() + 1e-8)  # [-0.707, 0.707]
    expected = torch.max(-normalised * 1.1, -normalised * 1.1).mean()
    torch.testing.assert_close(terms["loss_policy"], expected)


def test_value_clip_fraction_and_unclipped_value_loss():
    adv = torch.zeros(1, 4)
    old_values = torch.zeros(1, 4)
    values = torch.tensor([[0.1, 0.3, -0.5, 0.0]])
    mb = batch(adv, torch.zeros(1, 4), old_values)
    terms = PPOLoss(vf_clip_coef=0.2, clip_vloss=False, ent_coef=0.0)(mb, out(torch.zeros(1, 4), values, adv), PROGRESS)
    assert float(terms["value_clipfrac"]) == 0.5
    torch.testing.assert_close(terms["value_loss"], 0.5 * (values**2).mean())


def test_non_finite_or_negative_coefficients_are_refused():
    import pytest

    for bad in ({"ent_coef": float("nan")}, {"vf_coef": -1.0}, {"clip_coef": float("inf")}):
        ((name, value),) = bad.items()
        with pytest.raises(ValueError, match=f"^{name}={value!r} must be a finite number >= 0"):
            PPOLoss(**bad)


def test_teacher_led_rows_are_left_out_of_the_policy_terms_only():
    """Rows marked ``TEACHER_LED`` were not sampled from pi_old: the surrogate, advantage normalisation, approx_kl
    and clipfrac are those of plain PPO on the other rows; value loss and entropy keep every row."""
    adv = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 0.9, 1.1, 0.5]]))
    values, entropy = torch.tensor([[0.3, -0.1, 2.0, 1.0]]), torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    led = torch.tensor([[False, True, False, True]])
    loss = PPOLoss(norm_adv=True, ent_coef=0.1)
    mb = batch(adv, old, torch.zeros(1, 4))
    mb[keys.TEACHER_LED] = led
    terms = loss(mb, out(new, values, entropy), PROGRESS)
    keep = ~led[0]
    sub = out(new[:, keep], values[:, keep], entropy[:, keep])
    plain = loss(batch(adv[:, keep], old[:, keep], torch.zeros(1, 2)), sub, PROGRESS)
    for name in ("loss_policy", "approx_kl", "clipfrac"):
        torch.testing.assert_close(terms[name], plain[name])
    everything = loss(batch(adv, old, torch.zeros(1, 4)), out(new, values, entropy), PROGRESS)
    for name in ("loss_value", "loss_entropy", "value_clipfrac"):
        torch.testing.assert_close(terms[name], everything[name])
    # No teacher-led row: exactly plain PPO.
    mb[keys.TEACHER_LED] = torch.zeros(1, 4, dtype=torch.bool)
    none_led = loss(mb, out(new, values, entropy), PROGRESS)
    for name, value in everything.items():
        torch.testing.assert_close(none_led[name], value)


def built_minibatch(proportion: float):
    """experiment=debug with PPO and the supervisor leading ``proportion`` of the steps: the built parts after one
    rollout, the first minibatch's rows with random advantages and a stored log-probability shifted so that the
    ratios are far from 1 (clipped without a mask), and the policy's outputs on them."""
    from machina.policy.inputs import training_input
    from machina.startup.build import build
    from tests.conftest import compose_config

    cfg = compose_config(
        ["debug=tiny", "losses=[ppo,supervisor]", f"losses.supervisor.teacher_led_proportion={proportion}"]
    )
    torch.manual_seed(0)
    parts = build(cfg)
    parts.rollout.run(Progress(0, cfg.trainer.total_timesteps))
    exp = parts.experience
    rows = slice(0, exp.minibatch_segments)
    stored = exp.buffer[rows]
    minibatch = stored.copy()
    g = torch.Generator().manual_seed(1)
    minibatch[keys.ADVANTAGES] = torch.randn(stored.batch_size, generator=g).to(exp.device)
    minibatch[keys.PRIO_WEIGHTS] = torch.ones(stored.batch_size, device=exp.device)
    shift = torch.rand(stored.batch_size, generator=g).to(exp.device) - 0.5
    minibatch[keys.ACT_LOG_PROB] = stored[keys.ACT_LOG_PROB] + shift
    policy_out = parts.policy(training_input(stored, exp.row_state[rows]))
    return parts, stored, minibatch, policy_out


def policy_gradient(parts, term: torch.Tensor) -> torch.Tensor:
    params = [p for p in parts.policy.parameters() if p.requires_grad]
    grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
    return torch.cat(
        [torch.zeros(p.numel()) if g is None else g.flatten().cpu() for p, g in zip(params, grads, strict=True)]
    )


def test_ppo_trains_no_policy_gradient_on_teacher_led_steps_of_the_supervisor():
    """Every step teacher-led: the executed actions are the teacher's and PPO's policy term, its gradient, clipfrac
    and approx_kl are zero (without the mark they are not: the check can fail); the value loss still trains."""
    parts, stored, minibatch, policy_out = built_minibatch(1.0)
    assert bool(stored[keys.TEACHER_LED].all())
    assert torch.equal(stored[keys.ACTIONS], stored[keys.TEACHER_ACTIONS])
    ppo = parts.losses["ppo"]
    terms = ppo(minibatch, policy_out, PROGRESS)
    assert float(terms["policy_loss"]) == 0.0 and float(terms["clipfrac"]) == 0.0 and float(terms["approx_kl"]) == 0.0
    assert float(policy_gradient(parts, terms["loss_policy"]).abs().max()) == 0.0
    assert float(policy_gradient(parts, terms["loss_value"]).abs().max()) > 0.0
    unmarked = ppo(minibatch.exclude(keys.TEACHER_LED), policy_out, PROGRESS)
    assert float(unmarked["clipfrac"]) > 0.0
    assert float(policy_gradient(parts, unmarked["loss_policy"]).abs().max()) > 0.0


def test_ppo_on_half_teacher_led_steps_is_plain_ppo_on_the_policy_led_ones():
    parts, stored, minibatch, policy_out = built_minibatch(0.5)
    led = stored[keys.TEACHER_LED]
    assert 0.3 < float(led.float().mean()) < 0.7
    ppo = parts.losses["ppo"]
    terms = ppo(minibatch, policy_out, PROGRESS)
    sampled = ~led
    fresh = out(*(policy_out[key][sampled] for key in (keys.ACT_LOG_PROB, keys.VALUES, keys.ENTROPY)))
    plain = ppo(minibatch.exclude(keys.TEACHER_LED)[sampled], fresh, PROGRESS)
    for name in ("loss_policy", "clipfrac", "approx_kl"):
        torch.testing.assert_close(terms[name], plain[name])
    torch.testing.assert_close(
        policy_gradient(parts, terms["loss_policy"]), policy_gradient(parts, plain["loss_policy"])
    )
    everything = ppo(minibatch.exclude(keys.TEACHER_LED), policy_out, PROGRESS)
    torch.testing.assert_close(terms["loss_value"], everything["loss_value"])
    torch.testing.assert_close(terms["loss_entropy"], everything["loss_entropy"])
