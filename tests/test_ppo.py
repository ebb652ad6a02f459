"""The PPO loss on hand-made minibatches."""

import torch
from tensordict import TensorDict

from machina import keys
from machina.losses.base import Progress
from machina.losses.ppo import PPOLoss

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
        with pytest.raises(ValueError, match="losses.ppo"):
            PPOLoss(**bad)
