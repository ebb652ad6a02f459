"""The execution strategies (eager, compiled, graphed) and the CUDA-graph paths' plumbing, on the CPU: static inputs,
outputs that each replay overwrites, warm-up effects undone before the capture. A graph's semantics are those of its
function run on the static inputs with its outputs written into the same memory every replay; ``Rerun`` stands in
for the GPU with exactly that, so a graphed rollout and a graphed learner must train what the eager ones train.
(``tests/test_gpu.py`` captures real graphs.)"""

import pytest
import torch
from tensordict import TensorDict

from machina import keys
from machina.errors import ConfigError
from machina.startup.build import build, build_trainer
from machina.training.cuda_graph import CapturedCall
from machina.training.execution import Execution
from machina.training.learner import Learner
from machina.training.rollout import Rollout
from tests.conftest import compose_config

TINY = ["debug=tiny"]  # 16 envs x 4 cogs x 16 steps per epoch (conf/debug/tiny.yaml)


class Rerun:
    """A CPU stand-in for ``CudaGraph``: ``capture`` warms up, restores, then runs the function once; ``replay``
    runs it again and writes its outputs into the first call's tensors, as a replay writes its static memory."""

    warmup = 2

    def capture(self, fn, snapshot):
        restore = snapshot()
        rng = torch.get_rng_state()
        for _ in range(self.warmup):
            fn()
        restore()
        torch.set_rng_state(rng)
        self.fn, self.out = fn, fn()
        return self.out

    def replay(self):
        write_into(self.out, self.fn())


def write_into(static, new) -> None:
    """Copy ``new``'s tensors into ``static``'s, key by key (nested mappings too): a replay's outputs."""
    for key, value in new.items():
        if isinstance(value, torch.Tensor):
            static[key].copy_(value)
        else:
            write_into(static[key], value)


def graphed(trainer) -> None:
    """Rebuild ``trainer``'s rollout and learner as ``system.cuda_graphs`` would, with ``Rerun`` graphs."""
    r, learner = trainer.rollout, trainer.learner
    env = r.env.state_dict()  # a new Rollout resets the env
    trainer.rollout = Rollout(r.env, r.policy, r.losses, r.experience, r.stopwatch, Execution(graph=Rerun))
    r.env.load_state_dict(env)
    trainer.rollout.live.update_(r.live)
    trainer.learner = Learner(
        learner.policy, learner.losses, learner.experience, learner.optimizer, learner.stopwatch,
        learner.lr_schedule, learner.advantage, Execution(graph=Rerun), update_epochs=2,
        refresh_ratios=learner.refresh_ratios,
    )  # fmt: skip


def trained(overrides, graph: bool):
    # Float32 products: a graph and the eager loop agree to float rounding, which bf16-rounded inputs would blur.
    cfg = compose_config(
        [*TINY, "system.threads=1", "system.bf16_matmuls=false", "experience/sampler=prioritized", *overrides]
    )
    trainer = build_trainer(cfg, build(cfg), sinks=[])
    if graph:
        graphed(trainer)
    else:
        trainer.learner.update_epochs = 2
    torch.manual_seed(0)
    for _ in range(2):
        trainer.run_epoch()
    metrics = trainer.learner.pop_metrics()
    return trainer, metrics


@pytest.mark.parametrize("losses", ["[ppo]", pytest.param("[ppo,supervisor]", marks=pytest.mark.slow)])
def test_graphed_rollout_and_update_train_what_eager_ones_do(losses):
    """[ppo]: the forward and the env step as one graph; [ppo,supervisor]: teacher-led actions between them, so the
    forward alone. Both with prioritized sampling and two update passes (the second reads written-back ratios)."""
    (eager, eager_metrics), (graph, graph_metrics) = (trained([f"losses={losses}"], g) for g in (False, True))
    whole = losses == "[ppo]"
    assert (graph.rollout.whole_step is not None) == whole and (graph.rollout.forward is not None) != whole
    assert len(graph.learner.whole_update.graphs) >= 1
    for key in eager.learner.experience.buffer.keys():
        torch.testing.assert_close(graph.learner.experience.buffer[key], eager.learner.experience.buffer[key], msg=key)
    for (name, a), b in zip(eager.learner.policy.named_parameters(), graph.learner.policy.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    assert set(graph_metrics[0]) == set(eager_metrics[0]) and graph_metrics[1].keys() == eager_metrics[1].keys()
    for name, value in eager_metrics[0].items():
        torch.testing.assert_close(graph_metrics[0][name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_a_captured_call_reads_its_live_inputs_and_overwrites_its_outputs():
    from tensordict import TensorDict

    inputs = TensorDict({"x": torch.zeros(3)}, batch_size=[3])
    calls = []
    snapshot = lambda: lambda: calls.append("restored")  # noqa: E731
    call = CapturedCall(lambda td: TensorDict({"y": td["x"] * 2}, [3]), inputs, Rerun(), snapshot)
    first = call()
    assert calls == ["restored"]  # the warm-up's effects are undone once, before the capture
    inputs["x"].copy_(torch.tensor([1.0, 2.0, 3.0]))
    second = call()
    assert second is first  # the same static memory...
    assert torch.equal(first["y"], torch.tensor([2.0, 4.0, 6.0]))  # ...holding the replay of the live inputs
    assert calls == ["restored"]


def test_graphs_refuse_scheduled_coefficients_and_ranks():
    cfg = compose_config(
        [
            *TINY,
            "losses=[ppo,supervisor]",
            "+losses.supervisor.teacher_led_proportion={_target_: machina.schedules.Linear, start: 0.5, "
            "end: 0.0, end_step: 1000}",
        ]
    )
    parts = build(cfg)
    learner = parts.learner
    with pytest.raises(ConfigError, match="loss 'supervisor' follows a schedule"):
        Learner(learner.policy, parts.losses, parts.experience, parts.optimizer, learner.stopwatch,
                learner.lr_schedule, learner.advantage, Execution(graph=Rerun))  # fmt: skip


def test_a_graphed_rollout_restores_the_env_after_its_warm_up():
    cfg = compose_config([*TINY, "system.threads=1"])
    parts = build(cfg)
    env, eager_env = parts.env, build(cfg).env
    graphed_execution = Execution(graph=Rerun)
    rollout = Rollout(env, parts.policy, parts.losses, parts.experience, parts.rollout.stopwatch, graphed_execution)
    eager_env.reset()  # as the Rollout just did to its env
    out = rollout.whole_step()  # warm-up steps, restore, then the one step
    result = eager_env.step(out[keys.ACTIONS])
    for key in (keys.OBS, keys.REWARDS, keys.TRUNCATED):
        assert torch.equal(out["env"][key], result[key]), key
    for key, value in eager_env.state_dict().items():
        assert torch.equal(env.state_dict()[key], value), key


def test_eager_rollouts_run_in_inference_mode_and_graphed_ones_only_without_gradients():
    """A graph captured in inference mode can leave the CUDA generator's state as inference tensors that the
    learner's later capture, outside inference mode, may not update; eager steps gain a sixth of their host time."""
    cfg = compose_config([*TINY, "system.threads=1"])
    parts = build(cfg)
    modes = []
    step = parts.env.step

    def recording_step(actions):
        modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return step(actions)

    parts.env.step = recording_step
    for graph in (None, Rerun):
        execution = Execution(graph=graph)
        rollout = Rollout(parts.env, parts.policy, parts.losses, parts.experience, parts.rollout.stopwatch, execution)
        modes.clear()
        rollout.run(build_trainer(cfg, parts, sinks=[]).progress)
        assert set(modes) == ({(True, False)} if graph is None else {(False, False)}), graph


# The execution object: one choice of eager / compiled / graphed for the rollout and the learner.


def test_cuda_graphs_off_a_cuda_device_are_refused_with_the_setting_to_change():
    with pytest.raises(ConfigError, match=r"system.cuda_graphs=true captures CUDA graphs, but the device is cpu"):
        Execution.for_device(compile=False, cuda_graphs=True, device=torch.device("cpu"))
    assert Execution.for_device(compile=False, cuda_graphs=False, device=torch.device("cpu")).eager


def test_eager_execution_wraps_nothing_and_leaves_the_learning_rate_a_float():
    parts = build(compose_config(TINY))
    eager = Execution()
    assert eager.eager and not eager.graphs
    assert eager.function(parts.policy.act) == parts.policy.act
    assert eager.capture(lambda inputs: inputs, {}, lambda: lambda: None) is None
    assert eager.update(parts.learner._update, parts.policy, parts.optimizer, parts.losses, True) is None
    assert parts.learner.whole_update is None and isinstance(parts.optimizer.param_groups[0]["lr"], float)
    # Marking a dimension dynamic is the compiler's business: eager leaves the tensor as it was.
    td = TensorDict({keys.OBS: torch.zeros(2, 3, 4)}, batch_size=[2])
    eager.mark_dynamic(td, {keys.OBS: 2})
    assert not hasattr(td[keys.OBS], "_dynamo_weak_dynamic_indices")


def test_a_compiled_or_graphed_update_reads_its_learning_rate_from_a_device_tensor():
    for execution in (Execution(compile=True), Execution(graph=Rerun)):
        parts = build(compose_config(TINY))
        update = execution.update(parts.learner._update, parts.policy, parts.optimizer, parts.losses, True)
        assert update is not None
        lr = parts.optimizer.param_groups[0]["lr"]
        assert isinstance(lr, torch.Tensor) and float(lr) == pytest.approx(float(parts.learner.base_lrs[0]))


@pytest.mark.slow
def test_the_compiled_rollout_step_acts_as_the_eager_one():
    """The same policy step, eager and ``torch.compile``d (about 45 s cold on a 2-core CPU): the same values,
    log-probabilities and, with inductor drawing its random numbers as eager does, the same sampled actions."""
    import torch._inductor.config as inductor

    from machina.policy.inputs import rollout_input

    parts = build(compose_config([*TINY, "system.threads=1"]))
    policy, rollout = parts.policy, parts.rollout
    inputs = rollout_input(rollout.step_td, rollout.state)
    compiled = Execution(compile=True).function(policy.act)
    assert compiled is not policy.act
    outputs = []
    # The config module's own patch: a monkeypatch would delete the entry on undo (it is not in the module's
    # __dict__), breaking every later compile in the process.
    with torch.no_grad(), inductor.patch(fallback_random=True):
        for act in (policy.act, compiled):
            torch.manual_seed(0)
            outputs.append(act(inputs.clone()))
    eager, fast = outputs
    assert torch.equal(fast[keys.ACTIONS], eager[keys.ACTIONS])
    for key in (keys.VALUES, keys.ACT_LOG_PROB, *(keys.NEXT_STATE[k] for k in policy.state_keys)):
        torch.testing.assert_close(fast[key], eager[key], rtol=1e-5, atol=1e-5, msg=key)
