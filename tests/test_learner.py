"""The learner's schedule, early stop and metrics: the scheduled learning rate, target_kl, and metrics that
live on the data's device (or are host floats kept apart), made without constructing tensors from Python data."""

from contextlib import contextmanager

import pytest
import torch

from machina import keys
from machina.env.spec import PAD_TOKEN
from machina.startup.build import build, build_trainer
from tests.conftest import compose_config
from tests.test_rollout import TINY


def make_trainer(overrides):
    cfg = compose_config([*TINY, *overrides])
    return build_trainer(cfg, build(cfg), sinks=[])


def test_the_learner_sets_the_scheduled_learning_rate_of_every_group():
    trainer = make_trainer(["learner/lr_schedule=linear", "optimizer.lr=0.002", "trainer.total_timesteps=4096"])
    trainer.train()  # 4 epochs, each trained at the fraction where it starts: 0, 1/4, 2/4, 3/4 (CleanRL's schedule)
    assert trainer.learner.optimizer.param_groups[0]["lr"] == pytest.approx(0.002 / 4)
    host = trainer.history[-1]
    assert trainer.history and "overview/reward" in host
    trainer.total_timesteps = 8192
    trainer.learner.run(trainer.progress)  # agent step 4096 of 8192
    assert trainer.learner.optimizer.param_groups[0]["lr"] == pytest.approx(0.001)
    _, host_metrics = trainer.learner.pop_metrics()
    assert host_metrics["train/lr"] == pytest.approx(0.001)


def test_target_kl_stops_the_update_passes_early():
    trainer = make_trainer(["learner.update_epochs=4", "learner.target_kl=1e-9", "optimizer.lr=0.01"])
    trainer.rollout.run(trainer.progress)
    trainer.learner.run(trainer.progress)
    _, host = trainer.learner.pop_metrics()
    assert host["train/update_passes"] == 1.0  # the first pass moved the policy past the tiny target
    free = make_trainer(["learner.update_epochs=4"])
    free.rollout.run(free.progress)
    free.learner.run(free.progress)
    assert free.learner.pop_metrics()[1]["train/update_passes"] == 4.0


@contextmanager
def count_tensor_constructions(calls: list[str]):
    """Record torch.tensor / torch.as_tensor calls: each copies Python data to a device (a blocking copy on a GPU)."""
    saved = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}

    def counting(name):
        def construct(*args, **kwargs):
            calls.append(name)
            return saved[name](*args, **kwargs)

        return construct

    try:
        for name in saved:
            setattr(torch, name, counting(name))
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)


@pytest.mark.parametrize(
    "losses",
    [
        ["losses=[ppo]", "experience/sampler=prioritized"],
        ["losses=[ppo,supervisor]", "losses.supervisor.teacher_led_proportion=0.5"],
        ["losses=[sliced_scripted_cloner,ppo]"],
        ["losses=[ppo,eer_cloner]", "experience/sampler=prioritized"],
    ],
    ids=lambda o: o[0],
)
def test_metrics_stay_on_the_data_device_and_no_tensor_is_made_from_python_data(losses):
    trainer = make_trainer(losses)
    trainer.rollout.run(trainer.progress)
    trainer.learner.run(trainer.progress)  # warm-up: the optimizer creates its state (step counters) once
    trainer.learner.pop_metrics()
    calls: list[str] = []
    with count_tensor_constructions(calls):
        trainer.rollout.run(trainer.progress)
        trainer.learner.run(trainer.progress)
    assert calls == []
    device_metrics, host_metrics = trainer.learner.pop_metrics()
    assert device_metrics and all(
        v.device == trainer.learner.experience.device and v.dim() == 0 for v in device_metrics.values()
    )
    assert all(isinstance(v, float) for v in host_metrics.values())
    assert "experience/explained_variance" in device_metrics and "train/lr" in host_metrics


@pytest.mark.slow
def test_the_compiled_update_trains_the_same_parameters_as_the_eager_one():
    """system.compile=true runs each minibatch's whole update (forward, losses, backward, clip, Adam step) as one
    compiled function; on the same buffers and minibatch order it must end at the eager update's parameters (float32
    kernels fused differently: 1e-5 absolute after 12 minibatches; one thread, since two threads sum the embedding
    bag's gradient in a varying order), and neither a scheduled learning rate nor a new token width each epoch may
    make it recompile."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # no code compiled by an earlier test in this process: its learners' entries would count
    overrides = ["learner/lr_schedule=linear", "learner.update_epochs=2", "trainer.total_timesteps=3072"]
    overrides += ["system.threads=1", "system.bf16_matmuls=false"]  # float32 products: bf16 rounding would blur 1e-5
    eager, compiled = (make_trainer([*overrides, f"system.compile={flag}"]) for flag in ("false", "true"))
    compiled.learner.policy.load_state_dict(eager.learner.policy.state_dict())
    graphs, widths = [], []
    # No recompile at all, from the second minibatch on: a guard on anything the first call changes (a config
    # node's lookup cache once held the losses) would compile the whole update twice.
    with torch._dynamo.config.patch(error_on_recompile=True):
        for epoch in range(3):
            eager.rollout.run(eager.progress)
            source, target = eager.learner.experience, compiled.learner.experience
            # A real token far out in one observation: each epoch trains on another compacted width (61, 71, 81).
            source.buffer[keys.OBS][0, 0, 60 + 10 * epoch] = source.buffer[keys.OBS][0, 0, 0]
            target.buffer.update_(source.buffer)
            target.row_state.update_(source.row_state)
            target.last_values.copy_(source.last_values)
            for trainer in (eager, compiled):
                torch.manual_seed(epoch)  # the same shuffled minibatch order for both
                trainer.learner.run(trainer.progress)
                trainer.agent_step += source.batch_size
            graphs.append(counters["stats"]["unique_graphs"])
            widths.append(float(compiled.learner.experience.metrics()["experience/token_width"]))
    for (name, a), b in zip(eager.learner.policy.named_parameters(), compiled.learner.policy.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=f"{name} differs after the compiled updates")
    assert eager.learner.optimizer.param_groups[0]["lr"] == pytest.approx(
        float(compiled.learner.optimizer.param_groups[0]["lr"])
    )
    assert widths == [61.0, 71.0, 81.0]
    assert graphs[0] > 0 and graphs[2] == graphs[1] == graphs[0], f"graphs compiled after each epoch: {graphs}"
    assert (
        "train.update" in compiled.learner.stopwatch.totals and "train.forward" not in compiled.learner.stopwatch.totals
    )


def test_the_thread_governor_is_asked_before_every_minibatch():
    """A process that starts beside a run during its update costs it a second, not the rest of the epoch: the built
    learner calls ``System.follow_load`` before each minibatch of each pass (which reads /proc at most once a
    second)."""
    trainer = make_trainer(["learner.update_epochs=2"])
    learner = trainer.learner
    system = trainer.between_epochs.__self__  # the run's System, asked before each epoch as well
    assert type(system).__name__ == "System" and learner.between_minibatches == system.follow_load
    calls = []
    learner.between_minibatches = lambda: calls.append(learner.minibatches)
    trainer.rollout.run(trainer.progress)
    learner.run(trainer.progress)
    per_pass = learner.experience.num_minibatches
    assert per_pass > 1 and calls == list(range(2 * per_pass))  # before each one, none skipped or repeated


def test_the_checkpoints_loss_check_runs_a_compiled_policy_eagerly():
    """In a compiled run the check behind each checkpoint (``loss_check``, a forward without gradients) would be a
    graph of its own to compile, half a minute on 2 cores for a check; it runs eagerly. A counting backend stands in
    for the compiler: nothing reaches it from the check, and the same forward outside the check does."""
    from torch._dynamo.testing import CompileCounter

    from machina.policy.inputs import training_input

    trainer = make_trainer([])
    trainer.rollout.run(trainer.progress)
    trainer.learner.run(trainer.progress)
    counter = CompileCounter()
    policy, exp = trainer.learner.policy, trainer.learner.experience
    policy.compile(backend=counter)
    try:
        assert set(trainer.learner.loss_check()) == {f"losses/ppo/loss_{t}" for t in ("policy", "value", "entropy")}
        assert counter.frame_count == 0
        batch = exp.first_minibatch(trainer.learner.advantage(exp))
        with torch.no_grad():
            policy(training_input(batch.stored, batch.state))
        assert counter.frame_count > 0
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("policy", ["fast", "vit"])
def test_training_on_compacted_tokens_changes_nothing_but_the_width(policy):
    """The learner cuts token observations to the last slot that is real in any stored observation; the encoders
    give padding no weight (the bag) or mask it (the Perceiver), so the same buffers train the same parameters."""
    overrides = [f"policy={policy}", "learner.update_epochs=2", "system.threads=1"]
    if policy == "vit":
        overrides += ["policy.encoder.latent_dim=16", "policy.encoder.num_latents=4"]
    full, cut = (make_trainer([*overrides, f"experience.compact_tokens={flag}"]) for flag in ("false", "true"))
    cut.learner.policy.load_state_dict(full.learner.policy.state_dict())
    full.rollout.run(full.progress)
    cut.learner.experience.buffer.update_(full.learner.experience.buffer)
    cut.learner.experience.row_state.update_(full.learner.experience.row_state)
    cut.learner.experience.last_values.copy_(full.learner.experience.last_values)
    for trainer in (full, cut):
        torch.manual_seed(0)
        trainer.learner.run(trainer.progress)
    obs = full.learner.experience.buffer[keys.OBS]
    real = (obs[..., 1] != PAD_TOKEN).sum(-1)
    width = float(cut.learner.experience.metrics()["experience/token_width"])
    assert width == real.max() < obs.shape[-2]  # packed tokens: the widest observation's count, well under M
    # Float rounding only: the Perceiver's masked softmax sums over another number of (zero) padding terms, and Adam
    # amplifies rounding in near-zero gradients; 1e-5 is 1% of one Adam step (lr 1e-3), a wrong cut moves ~1e-3.
    for (name, a), b in zip(full.learner.policy.named_parameters(), cut.learner.policy.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=f"{name} differs when trained on compacted tokens")


def record_advantage_inputs(monkeypatch, trainer):
    """Spy on the learner's advantage computation: per call, the ratios it is given (agent-major, cloned) and a copy
    of the policy's weights at that moment (the policy the advantages are for)."""
    import copy

    import machina.training.advantage as advantage_module

    calls = []
    real = advantage_module.compute_advantages

    def spy(*args, **kwargs):
        calls.append((args[6].clone(), copy.deepcopy(trainer.learner.policy.state_dict())))
        return real(*args, **kwargs)

    monkeypatch.setattr(advantage_module, "compute_advantages", spy)
    return calls


def count_policy_forwards(policy):
    forwards = []
    policy.register_forward_hook(lambda *_: forwards.append(1))
    return forwards


def test_each_update_pass_uses_the_vtrace_ratios_of_the_policy_after_the_previous_pass(monkeypatch):
    """V-trace's rho_t = pi(a_t|x_t) / mu(a_t|x_t) with pi the current policy: the second pass's advantages must use
    the ratios of the policy as pass 1 left it, which this test computes itself (a fresh forward of the stored steps
    with pass 1's final weights, against the stored log-probs of the acting policy)."""
    from machina.policy.inputs import training_input
    from machina.training.experience import agent_major

    trainer = make_trainer(
        ["learner.update_epochs=2", "learner.refresh_ratios=true", "optimizer.lr=0.01", "system.threads=1"]
    )
    exp = trainer.learner.experience
    assert exp.num_minibatches > 1  # so ratios recorded during pass 1 come from several policies
    calls = record_advantage_inputs(monkeypatch, trainer)
    forwards = count_policy_forwards(trainer.learner.policy)
    trainer.rollout.run(trainer.progress)
    forwards.clear()
    trainer.learner.run(trainer.progress)
    assert len(calls) == 2
    first, _ = calls[0]
    assert torch.equal(first, torch.ones_like(first))  # pass 1: the policy that acted
    used, after_pass_1 = calls[1]
    reference = make_trainer(["system.threads=1"]).learner.policy
    reference.load_state_dict(after_pass_1)
    with torch.no_grad():
        out = reference(training_input(exp.buffer, exp.row_state))
    want = agent_major((out[keys.ACT_LOG_PROB].double() - exp.buffer[keys.ACT_LOG_PROB].double()).exp(), exp.num_agents)
    assert (want - 1).abs().max() > 1e-2  # the policy moved in pass 1, so a stale ratio would be caught
    torch.testing.assert_close(used.double(), want, rtol=0, atol=1e-5)
    # The cost: one no-grad forward of the buffer per pass after the first, in minibatch-sized blocks.
    assert len(forwards) == 2 * exp.num_minibatches + exp.segments // exp.minibatch_segments


def test_without_the_refresh_a_pass_uses_the_ratios_its_minibatches_recorded_in_the_pass_before(monkeypatch):
    """learner.refresh_ratios=false: no forward beyond the minibatches', and pass 2's V-trace ratios are, row by
    row, exp(log pi - log mu) of the policy that trained that row in pass 1 (before its own step), taken here from
    each pass-1 minibatch's forward output as it happened."""
    from machina.training.experience import agent_major

    trainer = make_trainer(
        ["learner.update_epochs=2", "learner.refresh_ratios=false", "optimizer.lr=0.01", "system.threads=1"]
    )
    exp = trainer.learner.experience
    assert exp.num_minibatches > 1
    calls = record_advantage_inputs(monkeypatch, trainer)
    forwards = count_policy_forwards(trainer.learner.policy)
    seen = torch.full(exp.buffer[keys.ACT_LOG_PROB].shape, float("nan"), dtype=torch.float64)
    record = exp.record_ratios

    def spy(rows, stored, log_prob):
        if len(calls) == 1:  # pass 1's minibatches
            seen[rows] = (log_prob.double() - stored[keys.ACT_LOG_PROB].double()).exp()
        record(rows, stored, log_prob)

    monkeypatch.setattr(exp, "record_ratios", spy)
    trainer.rollout.run(trainer.progress)
    forwards.clear()
    trainer.learner.run(trainer.progress)
    assert len(forwards) == 2 * exp.num_minibatches
    assert len(calls) == 2 and not seen.isnan().any()
    used = calls[1][0].double()
    want = agent_major(seen, exp.num_agents)
    assert (want - 1).abs().max() > 1e-3  # the policy moved within pass 1
    torch.testing.assert_close(used, want, rtol=0, atol=1e-6)


def test_a_single_update_pass_uses_ratio_one_and_no_extra_forward(monkeypatch):
    trainer = make_trainer(["learner.update_epochs=1", "optimizer.lr=0.01"])
    calls = record_advantage_inputs(monkeypatch, trainer)
    forwards = count_policy_forwards(trainer.learner.policy)
    trainer.rollout.run(trainer.progress)
    forwards.clear()
    trainer.learner.run(trainer.progress)
    assert len(calls) == 1 and torch.equal(calls[0][0], torch.ones_like(calls[0][0]))
    assert len(forwards) == trainer.learner.experience.num_minibatches


def test_refreshing_the_ratios_makes_no_host_read_and_no_tensor_from_python_data():
    """The per-pass ratio refresh (update_epochs > 1) keeps the update's rules: no Python-level host read and no
    tensor made from Python data."""
    from machina.speed.host_reads import count_host_reads

    trainer = make_trainer(["learner.update_epochs=2", "experience/sampler=prioritized"])
    trainer.rollout.run(trainer.progress)
    trainer.learner.run(trainer.progress)  # warm-up: optimizer state
    trainer.rollout.run(trainer.progress)
    trainer.learner.prepare()
    syncs: list[str] = []
    calls: list[str] = []
    with count_host_reads(syncs), count_tensor_constructions(calls):
        trainer.learner.update(trainer.progress)
    assert syncs == [] and calls == []
    assert trainer.learner.pop_metrics()[1]["train/update_passes"] == 2.0
