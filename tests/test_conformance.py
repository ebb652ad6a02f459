"""The conformance kit (``machina.conformance``) over every part machina's ``conf/`` names, found by walking it (a new
YAML is checked with no edit here), and over broken parts defined here, which fail with the sentence that says what
to implement."""

from functools import partial
from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import get_class
from omegaconf import OmegaConf

from machina import keys
from machina.conformance import ConformanceError, check_component, check_loss, check_round_trip, check_sink
from machina.conformance.component import EXAMPLES
from machina.conformance.config import compose
from machina.logging.sink import Sink
from machina.losses.ppo import PPOLoss
from machina.policy.component import Component
from machina.policy.heads import CriticHead
from tests.conf_walk import skipped_without_its_extra
from tests.conftest import CONF
from tests.test_checkpoint import teacher  # noqa: F401 (a fixture: a policy file for eer_kickstarter)

SLOTS = ("encoder", "core", "actor", "critic", "action_probs")


def conf_nodes(group: str) -> list[tuple[str, str, dict]]:
    """``(file stem, name, node)`` of every entry of every ``conf/<group>/*.yaml`` that names a class."""
    found = []
    for path in sorted((CONF / group).glob("*.yaml")):
        for name, node in (yaml.safe_load(path.read_text()) or {}).items():
            if isinstance(node, dict) and "_target_" in node:
                found.append((path.stem, name, node))
    return found


POLICY_SLOTS = [
    (path.stem, slot)
    for path in sorted((CONF / "policy").glob("*.yaml"))
    for slot in SLOTS
    if isinstance(yaml.safe_load(path.read_text()).get(slot), dict)
]
LOSSES = [name for _, name, _ in conf_nodes("losses")]
SINKS = [name for _, name, _ in conf_nodes("logger")]


def test_the_walk_finds_every_part_of_conf():
    """What the parametrized tests below run over: each YAML of the three groups, by what it names."""
    assert {stem for stem, _ in POLICY_SLOTS} == {p.stem for p in (CONF / "policy").glob("*.yaml")}
    assert set(LOSSES) == {p.stem for p in (CONF / "losses").glob("*.yaml")}
    assert set(SINKS) == {p.stem for p in (CONF / "logger").glob("*.yaml")}
    assert ("fast", "core") in POLICY_SLOTS and ("mlp", "core") not in POLICY_SLOTS  # mlp is feed-forward


@pytest.mark.parametrize(("policy", "slot"), POLICY_SLOTS)
def test_every_component_in_conf_conforms(policy, slot):
    config = OmegaConf.to_container(OmegaConf.load(CONF / "policy" / f"{policy}.yaml"))
    check_component(config[slot], policy=config)


# Each loss trains a tiny run here (about 1 s): the fast tier checks two, every loss module being covered there by
# tests/test_teacher_losses.py; the full suite checks them all.
FAST_LOSSES = ("ppo", "supervisor")


@pytest.mark.parametrize("name", [n if n in FAST_LOSSES else pytest.param(n, marks=pytest.mark.slow) for n in LOSSES])
def test_every_loss_in_conf_conforms(name, request):
    overrides = [f"losses=[{name}]"]
    node = compose(overrides).losses[name]
    if "teacher" in node and node.teacher.path is None:  # the loss reads a policy file the user names
        overrides.append(f"losses.{name}.teacher.path={request.getfixturevalue('teacher')}")
    if "gammas" in node:  # values at other discounts: the critic outputs one per discount
        overrides.append(f"+policy.critic.horizons={len(node.gammas)}")
    check_loss(name, overrides)


@pytest.mark.parametrize("name", SINKS)
def test_every_sink_in_conf_conforms(name, wandb_dirs):
    settings = OmegaConf.to_container(compose([f"logger=[{name}]", "wandb=offline"]).logger[name], resolve=True)
    check_sink(get_class(settings.pop("_target_")), wandb_dirs / "run", settings)


@pytest.mark.slow  # three trainings and an eval.py process; test_checkpoint.py's resumes are exact in the fast tier
def test_the_default_recipe_resumes_bit_exactly_and_evaluates(tmp_path):
    check_round_trip([], tmp_path)
    assert (tmp_path / "resumed" / "checkpoints" / "checkpoint_000002.pt").is_file()
    assert (tmp_path / "eval" / "eval.json").is_file()


@pytest.mark.slow  # three CartPole trainings and an eval.py process
def test_an_env_that_starts_new_episodes_on_resume_is_held_to_the_epochs_before_the_stop(tmp_path):
    """Gymnasium's envs cannot be saved (continues_episodes false): after the resume its episodes differ from the
    uninterrupted run's, which the round trip allows; the epoch before the stop must still be the same."""
    with skipped_without_its_extra():
        check_round_trip(["experiment=cartpole"], tmp_path)
    resumed = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert len(resumed) == 2


class CountingLoss(PPOLoss):
    """Logs how many rollouts it has seen, a count it keeps out of its state_dict: a resume starts it again."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.rollouts = 0

    def on_rollout_start(self, progress):
        self.rollouts += 1

    def forward(self, minibatch, policy_out, progress):
        return {**super().forward(minibatch, policy_out, progress), "rollouts": float(self.rollouts)}


def test_a_round_trip_finds_state_that_a_resume_loses(tmp_path):
    with pytest.raises(ConformanceError) as failed:
        check_round_trip([f"+losses.mine._target_={__name__}.CountingLoss"], tmp_path)
    assert str(failed.value).startswith(
        "after a resume, losses/mine/rollouts of epoch 2 is 1.0 where the uninterrupted run has 2.0: every part must "
        "save in its state_dict all it carries between epochs"
    )


class GatedCore(Component):
    """A component of a user's own, built right: ``ENCODED`` [N, D] -> ``CORE`` [N, width], a gated linear layer."""

    in_keys = (keys.ENCODED,)
    out_keys = (keys.CORE,)

    def __init__(self, dims, width: int = 8):
        super().__init__()
        self.linear = torch.nn.Linear(dims.widths[keys.ENCODED], 2 * width)
        self.out_widths = {keys.CORE: width}

    def forward(self, step, seq):
        value, gate = self.linear(step[keys.ENCODED]).chunk(2, -1)
        step[keys.CORE] = value * torch.sigmoid(gate)


@pytest.mark.parametrize("obs", ["tokens", "vector"])
def test_a_component_of_a_users_own_conforms_in_every_policy_it_fits(obs):
    """Defined here (not in conf/), given as a partial: checked in machina's smallest policy of each observation
    kind, its policy file (which names this test's class) included."""
    check_component(partial(GatedCore, width=6), obs=next(spec for spec in EXAMPLES if spec.kind == obs))


# Broken components: each fails with the sentence that says what to implement.


class ScaledCritic(CriticHead):
    """Writes the critic's [N, 1] output as it is: the trainer reads values as [N]."""

    def forward(self, step, seq):
        step[keys.VALUES] = self.net(step[keys.CORE])


class PeekingCritic(CriticHead):
    """Reads the observation without listing it in in_keys."""

    def forward(self, step, seq):
        step[keys.VALUES] = self.net(step[keys.CORE]).view(-1) + 0 * step[keys.OBS].float().sum()


class CpuCritic(CriticHead):
    """Allocates a buffer on the CPU whatever device it is built under."""

    def __init__(self, dims, **settings):
        super().__init__(dims, **settings)
        self.register_buffer("scale", torch.ones(1, device="cpu"))


class SilentEncoder(Component):
    """Lists ENCODED with its width but never writes it."""

    in_keys = (keys.OBS,)
    out_keys = (keys.ENCODED,)

    def __init__(self, dims):
        super().__init__()
        self.out_widths = {keys.ENCODED: 4}

    def forward(self, step, seq):
        pass


@pytest.mark.parametrize(
    ("component", "message"),
    [
        (
            ScaledCritic,
            "ScaledCritic writes values of shape [12, 1] but the trainer reads [N]: write step[VALUES] as a 1-d tensor",
        ),
        (PeekingCritic, "PeekingCritic reads 'env_obs' without listing it in in_keys: add it to in_keys"),
        (
            CpuCritic,
            "CpuCritic allocates scale on cpu when built on the meta device: create its tensors without an explicit "
            "device",
        ),
        (SilentEncoder, "SilentEncoder lists encoded in out_keys but never writes it: write it or drop it"),
        (
            PPOLoss,
            "the component's _target_ is 'machina.losses.ppo.PPOLoss', which is not a "
            "machina.policy.component.Component: name a subclass",
        ),
    ],
)
def test_a_broken_component_fails_with_what_to_implement(component, message):
    with pytest.raises(ConformanceError) as failed:
        check_component(component)
    assert str(failed.value).startswith(message) and "\n" not in str(failed.value)


# Broken losses, enabled beside PPO from the command line only.


class NonScalarLoss(PPOLoss):
    def forward(self, minibatch, policy_out, progress):
        return {"loss_mine": -policy_out[keys.ACT_LOG_PROB]}


class NanLoss(PPOLoss):
    def forward(self, minibatch, policy_out, progress):
        return {"loss_mine": policy_out[keys.ACT_LOG_PROB].mean() * float("nan")}


class DetachedLoss(PPOLoss):
    def forward(self, minibatch, policy_out, progress):
        return {"loss_mine": minibatch[keys.VALUES].mean()}


class UndeclaredLoss(PPOLoss):
    """Reads the full distribution without listing it in consumes, so nothing emits it."""

    def forward(self, minibatch, policy_out, progress):
        return {"loss_mine": policy_out[keys.FULL_LOG_PROBS].mean()}


class ForgetfulLoss(PPOLoss):
    """Counts its rollouts in its extra state but does not restore the count."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.rollouts = 0

    def on_rollout_start(self, progress):
        self.rollouts += 1

    def get_extra_state(self):
        return {"rollouts": self.rollouts}

    def set_extra_state(self, state):
        pass


class NeedsLidarLoss(PPOLoss):
    env_outputs = frozenset({"lidar"})


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        (
            NonScalarLoss,
            "NonScalarLoss.forward returns loss_mine of shape [16, 16], but the learner sums scalars: reduce it to a "
            "0-d tensor (a mean over the minibatch)",
        ),
        (
            NanLoss,
            "NanLoss.forward returns loss_mine = nan on a real minibatch: keep every term finite (guard divisions and "
            "logarithms)",
        ),
        (
            DetachedLoss,
            "DetachedLoss.forward returns loss_mine without a gradient: compute it from policy_out, not detached "
            "values",
        ),
        (UndeclaredLoss, "UndeclaredLoss reads a key that is neither stored nor consumed"),
        (
            ForgetfulLoss,
            "ForgetfulLoss's state does not survive a checkpoint (state_dict['_extra_state']['rollouts'] is 2 when "
            "saved and 0 after restore): return all of it from state_dict",
        ),
    ],
)
def test_a_broken_loss_fails_with_what_to_implement(loss, message):
    with pytest.raises(ConformanceError) as failed:
        check_loss("mine", [f"+losses.mine._target_={__name__}.{loss.__name__}"])
    assert str(failed.value).startswith(message) and "\n" not in str(failed.value)


def test_a_loss_that_is_not_enabled_is_named():
    with pytest.raises(ConformanceError, match=r"^loss 'mine' is not enabled by \[\]: select it"):
        check_loss("mine")


# Broken sinks.


class LastRowSink(Sink):
    """Rewrites its file with each row: only the last one is left."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def for_run(cls, run):
        return cls(run.dir / "rows.txt")

    def log(self, metrics):
        self.path.write_text(repr(metrics))


class BufferingSink(LastRowSink):
    """Keeps its rows in memory and never writes them."""

    def log(self, metrics):
        self.path.touch()


class NotASink:
    pass


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        (
            LastRowSink,
            "LastRowSink loses the row of epoch 1 in rows.txt: write every logged row, with its values in full, before "
            "close returns",
        ),
        (BufferingSink, "BufferingSink writes rows.txt but no logged row in any of them"),
        (NotASink, "NotASink is not a sink: subclass machina.logging.sink.Sink"),
        (Sink, "Sink.log fails on a run's call (NotImplementedError: )"),
    ],
)
def test_a_broken_sink_fails_with_what_to_implement(sink, message, tmp_path):
    with pytest.raises(ConformanceError) as failed:
        check_sink(sink, tmp_path, grace_s=0)
    assert str(failed.value).startswith(message) and "\n" not in str(failed.value)


def test_a_loss_the_builder_refuses_is_named_with_the_refusal():
    """A loss reading an env output the env does not declare: start-up's one-line refusal, as the kit's sentence."""
    with pytest.raises(ConformanceError) as failed:
        check_loss("mine", [f"+losses.mine._target_={__name__}.{NeedsLidarLoss.__name__}"])
    message = str(failed.value)
    assert message.startswith("a run with losses.mine is refused at start-up (loss 'mine' reads the env output lidar")
    assert "\n" not in message


def test_a_component_whose_class_cannot_be_imported_is_named():
    with pytest.raises(ConformanceError, match=r"^the component's _target_ is 'my_lab.nowhere.Encoder', which cannot"):
        check_component({"_target_": "my_lab.nowhere.Encoder", "_partial_": True})
