"""system.* settings really change torch's flags; bad values give errors that name the setting."""

import shutil

import numpy as np
import pytest
import torch

from machina import checks, keys
from machina.errors import ConfigError
from machina.speed import machine
from machina.startup.system import System


@pytest.fixture(autouse=True)
def restore_torch_flags():
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.get_num_threads(),
    )
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]
    torch.set_num_threads(saved[3])


def test_deterministic_true_sets_every_flag():
    System(seed=3, device="cpu", torch_deterministic=True).apply()
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic is True
    assert torch.backends.cudnn.benchmark is False


def test_deterministic_false_turns_benchmark_on():
    System(seed=3, device="cpu", torch_deterministic=False).apply()
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic is False
    assert torch.backends.cudnn.benchmark is True


def test_seed_makes_torch_and_numpy_repeat():
    System(seed=7, device="cpu").apply()
    a = torch.rand(3), np.random.rand(3)
    System(seed=7, device="cpu").apply()
    b = torch.rand(3), np.random.rand(3)
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_rank_offsets_the_seed():
    assert System(seed=7, device="cpu", rank=2).seed == 9


def test_threads_applied():
    System(device="cpu", threads=1).apply()
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("threads", ["many", -1, 1.5, True])
def test_a_thread_count_that_is_neither_a_count_nor_auto_is_refused(threads):
    with pytest.raises(ConfigError, match=r"^threads=.* must be an integer >= 0 or auto"):
        System(device="cpu", threads=threads)


def bf16_units() -> bool:
    """Whether torch takes bf16 float32 products here: AMX units (an AVX512-BF16 CPU without AMX, an AMD EPYC of
    Zen 4, computes them exactly)."""
    return torch.backends.mkldnn.is_available() and machine.bf16_products(machine.cpuinfo()[1])


def test_bf16_matmuls_round_a_float32_products_inputs_to_bfloat16_and_off_restores_full_precision():
    """The definition: with the flag, a float32 matrix product is that of its inputs rounded to bfloat16 (8 bits of
    mantissa), accumulated in float32, on a CPU with bf16 units; without it, the float32 product."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 128, generator=g), torch.randn(128, 512, generator=g)
    exact = (a.double() @ b.double()).float()
    rounded = (a.bfloat16().double() @ b.bfloat16().double()).float()
    assert (exact - rounded).abs().max() > 0.05  # the two definitions are far apart on these inputs

    System(device="cpu", bf16_matmuls=True).apply_flags()
    assert torch.get_float32_matmul_precision() == "medium"
    product = a @ b
    assert product.dtype == torch.float32
    torch.testing.assert_close(product, rounded if bf16_units() else exact, rtol=1e-5, atol=1e-4)
    # The products of a linear layer's backward too: the weight gradient is a product of the same kind.
    weight = b.t().clone().requires_grad_()
    torch.nn.functional.linear(a, weight).backward(torch.ones(256, 512))
    ones = torch.ones(512, 256)
    want = (ones.bfloat16().double() @ a.bfloat16().double()).float() if bf16_units() else ones @ a
    torch.testing.assert_close(weight.grad, want, rtol=1e-5, atol=1e-3)

    System(device="cpu", bf16_matmuls=False, tf32=True).apply_flags()
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cuda.matmul.allow_tf32
    torch.testing.assert_close(a @ b, exact, rtol=1e-5, atol=1e-4)
    System(device="cpu", bf16_matmuls=False, tf32=False).apply_flags()
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cuda.matmul.allow_tf32


def test_bf16_matmuls_are_tf32_products_on_a_gpu_even_with_tf32_off():
    """On CUDA, torch's "medium" precision of float32 products is TF32 (there is no bfloat16 path for them): the
    switch cuBLAS reads says TF32 although system.tf32=false; convolutions follow system.tf32 alone."""
    System(device="cpu", bf16_matmuls=True, tf32=False).apply_flags()
    assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is False
    System(device="cpu", bf16_matmuls=False, tf32=False).apply_flags()
    assert torch.backends.cuda.matmul.allow_tf32 is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_matmuls_on_a_gpu_keep_more_than_bfloat16s_precision_and_say_so(caplog):
    """TF32 keeps 10 bits of mantissa where bfloat16 keeps 8: the product is several times closer to the exact one
    than the product of bfloat16-rounded inputs; the start-up log says the products are TF32."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 128, generator=g), torch.randn(128, 512, generator=g)
    exact = (a.double() @ b.double()).float()
    bf16_error = ((a.bfloat16().double() @ b.bfloat16().double()).float() - exact).abs().max()
    with caplog.at_level("WARNING", logger="machina.startup.system"):
        System(device="cuda", bf16_matmuls=True, tf32=False).apply_flags()
    assert "run in TF32 although system.tf32=false" in caplog.text
    error = ((a.cuda() @ b.cuda()).cpu() - exact).abs().max()
    assert error < bf16_error / 2, (error, bf16_error)


def test_evaluation_computes_in_float32_inside_a_bf16_run_and_gives_the_run_its_setting_back():
    from machina.precision import float32_products

    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 128, generator=g), torch.randn(128, 32, generator=g)
    exact = (a.double() @ b.double()).float()
    System(device="cpu", bf16_matmuls=True).apply_flags()
    with float32_products():
        assert torch.get_float32_matmul_precision() in ("highest", "high")
        torch.testing.assert_close(a @ b, exact, rtol=1e-5, atol=1e-4)
    assert torch.get_float32_matmul_precision() == "medium"
    for tf32 in (True, False):  # TF32 (GPUs) stays as the run set it, inside the block and after
        System(device="cpu", bf16_matmuls=False, tf32=tf32).apply_flags()
        with float32_products():
            assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")


@pytest.mark.slow  # torch.compile
def test_an_evaluation_inside_a_compiled_run_does_not_recompile_its_policy():
    """torch.compile guards a compiled function on the TF32 switch: an evaluation that flipped it would compile the
    policy again, a minute of a compiled run's time on this CPU."""
    from torch._dynamo.utils import counters

    from machina.precision import float32_products

    layer = torch.nn.Linear(8, 8)
    compiled = torch.compile(lambda x: layer(x).relu())
    x = torch.randn(4, 8)
    for bf16 in (False, True):
        torch._dynamo.reset()
        counters.clear()
        System(device="cpu", bf16_matmuls=bf16, tf32=True).apply_flags()
        compiled(x)
        with float32_products():
            compiled(x)
        compiled(x)
        assert counters["stats"]["unique_graphs"] == 1, bf16


def test_bf16_matmuls_must_be_true_or_false():
    with pytest.raises(ConfigError, match="^bf16_matmuls='yes' must be true or false"):
        System(device="cpu", bf16_matmuls="yes")


def test_device_auto_and_errors():
    assert checks.device("system.device", "auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert checks.device("system.device", "cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="system.device='tpu' is not a device"):
        checks.device("system.device", "tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available here; set it to cpu or auto"):
            checks.device("system.device", "cuda")


def test_cuda_graphs_refused_off_cuda():
    with pytest.raises(ConfigError, match="^cuda_graphs=true captures CUDA graphs, but device resolved to cpu"):
        System(device="cpu", cuda_graphs=True)
    assert System(device="cpu", cuda_graphs=False).cuda_graphs is False


def test_compile_auto_compiles_long_runs_where_a_compiler_is_present(tmp_path, monkeypatch):
    def auto(total_timesteps):
        return System(device="cpu", compile="auto", compile_min_timesteps=1000, total_timesteps=total_timesteps)

    assert shutil.which("g++") or shutil.which("c++"), "this test needs the machine's C++ compiler"
    assert auto(1000).compile is True and auto(999).compile is False
    assert System(device="cpu", compile=True, total_timesteps=1).compile is True
    # With no C++ compiler on the PATH, auto leaves a long run eager instead of failing at its first compile.
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert auto(10**9).compile is False
    with pytest.raises(ConfigError, match="^compile='yes' must be true, false or auto"):
        System(device="cpu", compile="yes")


def test_the_recipe_compiles_only_runs_long_enough_to_win_the_compile_back():
    from machina.startup.build import build
    from tests.conftest import compose_config

    assert build(compose_config(["debug=tiny"])).system.compile is False  # tests and check runs stay eager
    recipe = compose_config([])
    assert recipe.system.compile == "auto" and recipe.trainer.total_timesteps < recipe.system.compile_min_timesteps


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"seed": -1}, "^seed=-1 must be"), ({"threads": -2}, "^threads=-2 must be")]
)
def test_bad_values(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        System(device="cpu", **kwargs)


@pytest.mark.slow
def test_compiled_policy_matches_the_eager_one_and_keeps_its_parameter_names():
    from hydra.utils import instantiate

    from machina.policy.inputs import STEP_INPUTS, rollout_input
    from machina.startup.build import build
    from tests.conftest import compose_config

    overrides = ["debug=tiny", "env.num_envs=4", "experience.batch_size=512"]
    compiled = build(compose_config([*overrides, "system.compile=true"])).policy
    cfg = compose_config(overrides)
    env = instantiate(cfg.env)
    eager = instantiate(cfg.policy, obs_spec=env.spec.obs, num_actions=env.spec.num_actions)
    assert set(compiled.state_dict()) == set(eager.state_dict())
    eager.load_state_dict(compiled.state_dict())
    step = env.reset()
    step[keys.EPISODE_START] = torch.ones(env.num_agents)
    state = eager.initial_state(env.num_agents, "cpu")
    # The rollout's step (``act``, no time axis) of the eager policy against the compiled forward over a [N, 1]
    # sequence: the same values, so compiling changed neither the weights' names nor what they compute.
    sequence = rollout_input(step, state)
    for key in STEP_INPUTS:
        sequence[key] = sequence[key].unsqueeze(1)
    with torch.no_grad():
        a = eager.act(rollout_input(step, state))["values"]
        b = compiled(sequence)["values"][:, 0]
    assert a.shape == (env.num_agents,)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
