"""The policy contract the trainer relies on, checked for every ``conf/policy/*.yaml`` (found in the folder, so a new
policy is covered with no edit), on the kind of observations its encoder reads."""

import contextlib
from pathlib import Path

import hydra
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from machina.conformance.component import observation_kinds
from machina.env.spec import PAD_TOKEN, ImageObsSpec, ObsSpec, VectorObsSpec
from machina.errors import ConfigError
from machina.files import checksum
from machina.keys import (
    ACT_LOG_PROB,
    ACTIONS,
    CELL,
    ENTROPY,
    EPISODE_START,
    FULL_LOG_PROBS,
    HIDDEN,
    LOGITS,
    NEXT_HIDDEN,
    NEXT_STATE,
    OBS,
    QRNN_CELL,
    VALUES,
)
from machina.policy.action_probs import ActionProbs
from machina.policy.io import load_policy, policy_payload
from tests.conftest import compose_config

CONF = Path(__file__).resolve().parents[1] / "conf" / "policy"
POLICIES = sorted(path.stem for path in CONF.glob("*.yaml"))
SPEC = ObsSpec(
    max_tokens=16,
    window=11,
    feature_names=("wall", "agent", "hp", "ore", "heart", "cooldown"),
    feature_norms=(1.0, 1.0, 100.0, 10.0, 5.0, 255.0),
)
VECTOR_SPEC = VectorObsSpec(size=6)
SPECS = {spec.kind: spec for spec in (SPEC, VECTOR_SPEC, ImageObsSpec(size=75, height=5, width=5, channels=3))}
NUM_ACTIONS = 7


def spec_of(name: str) -> ObsSpec | VectorObsSpec:
    """The observations policy ``name`` reads: the first kind its encoder takes."""
    return SPECS[observation_kinds(OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml")))[0]]


# Policies with recurrent state (a core), and those that read tokens (padding is theirs).
RECURRENT = [name for name in POLICIES if OmegaConf.load(CONF / f"{name}.yaml").core is not None]
TOKEN_POLICIES = [name for name in POLICIES if isinstance(spec_of(name), ObsSpec)]


def make_policy(name: str, emit: bool = True) -> torch.nn.Module:
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    cfg.action_probs.emit_full_log_probs = emit  # the real config derives it with the trainer's resolver
    torch.manual_seed(0)
    return hydra.utils.instantiate(cfg, obs_spec=spec_of(name), num_actions=NUM_ACTIONS)


def random_obs(batch: int, steps: int, tokens: int = SPEC.max_tokens, spec=SPEC) -> torch.Tensor:
    """The policy's observations [batch, steps, ...]: float32 vectors for a vector spec; for tokens, uint8 [batch,
    steps, tokens, 3] with a random number of real tokens per observation (none in one), then padding. The first
    token lies on the agent's own cell, where token envs put what the agent holds."""
    if isinstance(spec, VectorObsSpec):
        return torch.randn(batch, steps, spec.size)
    dy, dx = torch.randint(0, SPEC.window, (2, batch, steps, tokens))
    dy[..., 0] = dx[..., 0] = SPEC.window // 2
    feature = torch.randint(0, SPEC.num_features, (batch, steps, tokens))
    value = torch.randint(0, 256, (batch, steps, tokens))
    obs = torch.stack((dy << 4 | dx, feature, value), -1).to(torch.uint8)
    count = torch.randint(0, tokens + 1, (batch, steps, 1))
    count[0, 0] = 0
    obs[torch.arange(tokens) >= count] = PAD_TOKEN
    return obs


def sequence_td(policy, obs, dones, state=None, actions=None) -> TensorDict:
    batch = obs.shape[0]
    td = TensorDict({OBS: obs, EPISODE_START: dones}, batch_size=[batch])
    td.update(policy.initial_state(batch, "cpu") if state is None else state)
    if actions is not None:
        td[ACTIONS] = actions
    return td


def random_state(policy, batch: int) -> TensorDict:
    state = policy.initial_state(batch, "cpu")
    return state.apply(torch.randn_like)


def obs_for(policy, batch: int, steps: int) -> torch.Tensor:
    """Random observations of the kind ``policy`` reads."""
    return random_obs(batch, steps, spec=policy.obs_spec)


def next_keys(policy) -> list[str]:
    """The keys of the state after a step or a sequence, one per state key."""
    return [NEXT_STATE[key] for key in policy.state_keys]


@contextlib.contextmanager
def host_syncs_forbidden():
    """Make every Tensor -> Python conversion raise while the block runs."""

    def refuse(*args, **kwargs):
        raise AssertionError("host sync in the policy forward")

    names = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")
    saved = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, refuse)
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def test_emit_full_log_probs_is_derived_in_one_place_for_every_policy():
    """conf/config.yaml sets it once from the losses; no policy file names it, so a new policy cannot forget it."""
    for path in sorted(CONF.glob("*.yaml")):
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        assert "emit_full_log_probs" not in raw["action_probs"], path.name
    root = OmegaConf.to_container(OmegaConf.load(CONF.parent / "config.yaml"), resolve=False)
    assert root["policy"]["action_probs"]["emit_full_log_probs"] == "${consumes:full_log_probs,${losses}}"
    for name in sorted(p.stem for p in CONF.glob("*.yaml")):
        for losses, emitted in (("[ppo]", False), ("[ppo,supervisor]", True)):
            cfg = compose_config([f"policy={name}", f"losses={losses}"])
            assert cfg.policy.action_probs.emit_full_log_probs is emitted


@pytest.mark.parametrize("emit", [False, True])
def test_a_policy_file_stores_no_emit_flag_and_its_loader_chooses_it(tmp_path, emit):
    cfg = compose_config(["losses=[ppo,supervisor]"] if emit else [])
    policy_config = OmegaConf.to_container(cfg.policy, resolve=True)
    policy = hydra.utils.instantiate(cfg.policy, obs_spec=SPEC, num_actions=NUM_ACTIONS)
    payload = policy_payload(policy, policy_config, SPEC)
    assert payload["architecture"]["action_probs"] == {"_target_": "machina.policy.action_probs.ActionProbs"}
    torch.save(payload, tmp_path / "policy.pt")
    for asked in (False, True):
        loaded, _ = load_policy(tmp_path / "policy.pt", emit_full_log_probs=asked)
        assert loaded.action_probs.emit_full_log_probs is asked
    # A file written before the flag left the architecture holds it: it still loads, and the loader's choice wins.
    older = {**payload, "architecture": dict(policy_config)}
    torch.save(checksum.seal(older), tmp_path / "older.pt")
    for asked in (False, True):
        loaded, _ = load_policy(tmp_path / "older.pt", emit_full_log_probs=asked)
        assert loaded.action_probs.emit_full_log_probs is asked
    # Anything but a boolean there is not what machina wrote: refused with the entry named.
    edited = {**policy_config, "action_probs": {**policy_config["action_probs"], "emit_full_log_probs": "yes"}}
    torch.save(checksum.seal({**payload, "architecture": edited}), tmp_path / "edited.pt")
    with pytest.raises(ConfigError, match=r"architecture\.action_probs\.emit_full_log_probs is 'yes', not a boolean"):
        load_policy(tmp_path / "edited.pt")


def test_a_policy_file_written_before_axis_or_direction_embeddings_loads_and_acts_as_saved(tmp_path):
    """policy=fast's files from before ``encoder.axis_embeddings`` (or ``encoder.direction_embeddings``) hold no such
    key and no such rows: they build the encoder without them and give the saved policy's outputs; today's files
    rebuild with them."""
    without_axis = ["~policy.encoder.axis_embeddings", "~policy.encoder.direction_embeddings"]
    for overrides, axis, direction in (
        (without_axis, False, False),
        (["~policy.encoder.direction_embeddings"], True, False),
        ([], True, True),
    ):
        cfg = compose_config(overrides)
        policy_config = OmegaConf.to_container(cfg.policy, resolve=True)
        policy = hydra.utils.instantiate(cfg.policy, obs_spec=SPEC, num_actions=NUM_ACTIONS).eval()
        with torch.no_grad():  # the axis and direction rows start at zero: make every weight matter to the outputs
            for parameter in policy.parameters():
                parameter.normal_(0.0, 0.1)
        torch.save(policy_payload(policy, policy_config, SPEC), tmp_path / "policy.pt")
        loaded, _ = load_policy(tmp_path / "policy.pt")
        names = {name for name, _ in loaded.named_parameters()}
        assert ("encoder.row_rows" in names) is axis and ("encoder.column_rows" in names) is axis
        assert ("encoder.direction_rows" in names) is direction
        obs, dones = random_obs(6, 3), torch.zeros(6, 3)
        with torch.no_grad():
            want, got = policy(sequence_td(policy, obs, dones)), loaded.eval()(sequence_td(loaded, obs, dones))
        torch.testing.assert_close(got[LOGITS], want[LOGITS])
        torch.testing.assert_close(got[VALUES], want[VALUES])


def test_a_policy_file_written_before_the_core_skip_loads_without_it_and_acts_as_saved(tmp_path):
    """policy=fast's files from before ``core.skip`` hold no such key: they rebuild without the highway (``none``) and
    give the saved policy's outputs, while today's files rebuild with it; the two policies act differently, so a file
    loaded with the wrong one would show."""
    obs, dones = random_obs(6, 3), torch.zeros(6, 3)
    logits = {}
    for overrides, skip in ((["~policy.core.skip"], "none"), ([], "highway")):
        cfg = compose_config(overrides)
        torch.manual_seed(0)
        policy = hydra.utils.instantiate(cfg.policy, obs_spec=SPEC, num_actions=NUM_ACTIONS).eval()
        with torch.no_grad():
            for parameter in policy.parameters():
                parameter.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(parameter.numel()))
        torch.save(policy_payload(policy, OmegaConf.to_container(cfg.policy, resolve=True), SPEC), tmp_path / "p.pt")
        loaded, _ = load_policy(tmp_path / "p.pt")
        assert loaded.core.skip.kind == skip
        with torch.no_grad():
            want, got = policy(sequence_td(policy, obs, dones)), loaded.eval()(sequence_td(loaded, obs, dones))
        torch.testing.assert_close(got[LOGITS], want[LOGITS])
        torch.testing.assert_close(got[VALUES], want[VALUES])
        logits[skip] = got[LOGITS]
    assert not torch.allclose(logits["none"], logits["highway"])


@pytest.mark.parametrize("name", POLICIES)
def test_state_and_experience_spec(name):
    policy = make_policy(name)
    core = OmegaConf.load(CONF / f"{name}.yaml").core
    lstm = core is not None and core._target_.endswith("LSTMCore")
    assert policy.state_keys == ((HIDDEN, CELL) if lstm else (QRNN_CELL,) if name in RECURRENT else ())
    state = policy.initial_state(5, "cpu")
    assert state.batch_size == torch.Size([5])
    for key in policy.state_keys:
        assert state[key].shape == (5, policy.state_widths[key])
        assert state[key].dtype == torch.float32
        assert not state[key].any()
    spec = policy.experience_spec()
    obs = policy.obs_spec
    tokens = isinstance(obs, ObsSpec)
    assert spec[OBS] == (((obs.max_tokens, 3), torch.uint8) if tokens else ((obs.size,), torch.float32))
    assert spec.get(EPISODE_START) == (((), torch.float32) if name in RECURRENT else None)
    assert spec[ACTIONS] == ((), torch.int64)


@pytest.mark.parametrize("emit", [True, False])
@pytest.mark.parametrize("name", POLICIES)
def test_rollout_outputs(name, emit):
    policy = make_policy(name, emit)
    batch = 6
    with torch.no_grad():
        td = policy(sequence_td(policy, obs_for(policy, batch, 1), torch.zeros(batch, 1)))
    assert td[ACTIONS].shape == (batch, 1) and td[ACTIONS].dtype == torch.int64
    assert ((td[ACTIONS] >= 0) & (td[ACTIONS] < NUM_ACTIONS)).all()
    for key in (ACT_LOG_PROB, VALUES):
        assert td[key].shape == (batch, 1) and td[key].dtype == torch.float32
        assert td[key].isfinite().all()
    for key, width in policy.state_widths.items():
        assert td[NEXT_STATE[key]].shape == (batch, width)
    assert ENTROPY not in td
    assert (FULL_LOG_PROBS in td) == emit
    if emit:
        assert td[FULL_LOG_PROBS].shape == (batch, 1, NUM_ACTIONS)
        gathered = td[FULL_LOG_PROBS].gather(-1, td[ACTIONS].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(gathered, td[ACT_LOG_PROB])


@pytest.mark.parametrize("emit", [True, False])
@pytest.mark.parametrize("name", POLICIES)
def test_training_outputs(name, emit):
    policy = make_policy(name, emit)
    batch, steps = 3, 4
    actions = torch.randint(0, NUM_ACTIONS, (batch, steps))
    td = policy(sequence_td(policy, obs_for(policy, batch, steps), torch.zeros(batch, steps), actions=actions))
    assert torch.equal(td[ACTIONS], actions)
    for key in (ACT_LOG_PROB, ENTROPY, VALUES):
        assert td[key].shape == (batch, steps) and td[key].dtype == torch.float32
    assert (td[ENTROPY] > 0).all() and (td[ACT_LOG_PROB] < 0).all()
    for key, width in policy.state_widths.items():
        assert td[NEXT_STATE[key]].shape == (batch, width)
    assert (FULL_LOG_PROBS in td) == emit
    if emit:
        assert td[FULL_LOG_PROBS].shape == (batch, steps, NUM_ACTIONS)
        gathered = td[FULL_LOG_PROBS].gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(gathered, td[ACT_LOG_PROB])


@pytest.mark.parametrize("name", POLICIES)
def test_emit_full_log_probs_can_be_switched_at_runtime(name):
    policy = make_policy(name, emit=False)
    policy.action_probs.emit_full_log_probs = True
    with torch.no_grad():
        td = policy(sequence_td(policy, obs_for(policy, 2, 1), torch.zeros(2, 1)))
    assert td[FULL_LOG_PROBS].shape == (2, 1, NUM_ACTIONS)


@pytest.mark.parametrize("name", POLICIES)
def test_training_sequence_reproduces_step_by_step_rollout(name):
    """Rollout one step at a time with ``act`` (no time axis), carrying the state; one [B, T] training forward must
    give the same numbers."""
    policy = make_policy(name)
    batch, steps = 4, 6
    obs = obs_for(policy, batch, steps)
    dones = (torch.rand(batch, steps) < 0.3).float()
    start = random_state(policy, batch)
    state = start.clone()
    actions, log_probs, values, full = [], [], [], []
    with torch.no_grad():
        for t in range(steps):
            td = policy.act(sequence_td(policy, obs[:, t], dones[:, t], state))
            state = TensorDict({key: td[NEXT_STATE[key]] for key in policy.state_keys}, batch_size=[batch])
            actions.append(td[ACTIONS])
            log_probs.append(td[ACT_LOG_PROB])
            values.append(td[VALUES])
            full.append(td[FULL_LOG_PROBS])
            assert td[ACTIONS].shape == (batch,) and td[FULL_LOG_PROBS].shape == (batch, NUM_ACTIONS)
        trained = policy(sequence_td(policy, obs, dones, start, actions=torch.stack(actions, 1)))
    torch.testing.assert_close(trained[ACT_LOG_PROB], torch.stack(log_probs, 1))
    torch.testing.assert_close(trained[VALUES], torch.stack(values, 1))
    torch.testing.assert_close(trained[FULL_LOG_PROBS], torch.stack(full, 1))
    for key in policy.state_keys:
        torch.testing.assert_close(trained[NEXT_STATE[key]], state[key])


@pytest.mark.parametrize("name", RECURRENT)
def test_done_resets_the_recurrent_state(name):
    policy = make_policy(name)
    batch, steps, reset_at = 3, 5, 2
    obs = obs_for(policy, batch, steps)
    actions = torch.randint(0, NUM_ACTIONS, (batch, steps))
    dones = torch.zeros(batch, steps)
    dones[:, reset_at] = 1.0
    with torch.no_grad():
        whole = policy(sequence_td(policy, obs, dones, random_state(policy, batch), actions))
        tail = policy(sequence_td(policy, obs[:, reset_at:], dones[:, reset_at:], actions=actions[:, reset_at:]))
        no_reset = policy(sequence_td(policy, obs, torch.zeros_like(dones), random_state(policy, batch), actions))
    for key in (ACT_LOG_PROB, VALUES):
        torch.testing.assert_close(whole[key][:, reset_at:], tail[key])
        assert not torch.allclose(no_reset[key][:, reset_at:], tail[key])
    for key in next_keys(policy):
        torch.testing.assert_close(whole[key], tail[key])


@pytest.mark.parametrize("name", TOKEN_POLICIES)
def test_padding_tokens_do_not_change_the_output(name):
    policy = make_policy(name)
    batch, steps = 4, 3
    obs = random_obs(batch, steps)
    actions = torch.randint(0, NUM_ACTIONS, (batch, steps))
    dones = torch.zeros(batch, steps)
    # More padding at the end, and the real tokens scattered among the padding slots.
    padded = torch.cat((obs, torch.full((batch, steps, 9, 3), PAD_TOKEN, dtype=torch.uint8)), 2)
    shuffled = padded[:, :, torch.randperm(padded.shape[2])]
    with torch.no_grad():
        outputs = [policy(sequence_td(policy, o, dones, actions=actions)) for o in (obs, padded, shuffled)]
    for key in (ACT_LOG_PROB, ENTROPY, VALUES, *next_keys(policy)):
        assert outputs[0][key].isfinite().all()
        for other in outputs[1:]:
            torch.testing.assert_close(other[key], outputs[0][key])


@pytest.mark.parametrize("name", POLICIES)
def test_gradients_reach_every_parameter(name):
    policy = make_policy(name)
    batch, steps = 3, 4
    td = sequence_td(
        policy,
        obs_for(policy, batch, steps),
        torch.zeros(batch, steps),
        random_state(policy, batch),
        torch.randint(0, NUM_ACTIONS, (batch, steps)),
    )
    td = policy(td)
    (td[ACT_LOG_PROB].sum() + td[ENTROPY].sum() + td[VALUES].sum()).backward()
    for param_name, param in policy.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize("name", POLICIES)
def test_rollout_forward_makes_no_host_sync(name):
    policy = make_policy(name)
    td = sequence_td(policy, obs_for(policy, 8, 1), (torch.rand(8, 1) < 0.5).float(), random_state(policy, 8))
    with torch.no_grad(), host_syncs_forbidden():
        td = policy(td)
    assert td[ACTIONS].shape == (8, 1)


def test_sampled_actions_follow_the_softmax():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    samples = 40_000
    step = TensorDict({LOGITS: probs.log().expand(samples, -1)}, batch_size=[samples])
    torch.manual_seed(0)
    ActionProbs(emit_full_log_probs=False)(step, TensorDict({}, batch_size=[]))
    frequencies = torch.bincount(step[ACTIONS], minlength=4).float() / samples
    torch.testing.assert_close(frequencies, probs, atol=0.01, rtol=0)


@pytest.mark.parametrize("name", POLICIES)
def test_output_keys_follow_the_emit_flag(name):
    policy = make_policy(name, emit=False)
    assert {ACTIONS, ACT_LOG_PROB, ENTROPY, VALUES, *next_keys(policy)} <= set(policy.output_keys())
    assert FULL_LOG_PROBS not in policy.output_keys()
    policy.action_probs.emit_full_log_probs = True
    assert FULL_LOG_PROBS in policy.output_keys()


@pytest.mark.parametrize("core", [None, "none"])
def test_policy_without_a_core_is_feed_forward(core):
    cfg = OmegaConf.load(CONF / "fast.yaml")
    cfg.action_probs.emit_full_log_probs = False
    cfg.core = core
    policy = hydra.utils.instantiate(cfg, obs_spec=SPEC, num_actions=NUM_ACTIONS)
    assert policy.state_keys == ()
    assert EPISODE_START not in policy.experience_spec()
    obs = random_obs(3, 4)
    actions = torch.randint(0, NUM_ACTIONS, (3, 4))
    td = policy(TensorDict({OBS: obs, ACTIONS: actions}, batch_size=[3]))
    assert td[VALUES].shape == (3, 4) and NEXT_HIDDEN not in td
    # Without state, each step's output depends on its own observation only.
    alone = policy(TensorDict({OBS: obs[:, 2:3], ACTIONS: actions[:, 2:3]}, batch_size=[3]))
    torch.testing.assert_close(alone[ACT_LOG_PROB], td[ACT_LOG_PROB][:, 2:3])


def test_a_component_reading_a_key_nobody_writes_is_refused():
    cfg = OmegaConf.load(CONF / "fast.yaml")
    cfg.action_probs.emit_full_log_probs = False
    cfg.encoder = cfg.actor  # the actor head reads CORE, which nothing before it writes
    with pytest.raises(Exception, match="reads \\['core'\\], which no component before it writes"):
        hydra.utils.instantiate(cfg, obs_spec=SPEC, num_actions=NUM_ACTIONS)
