"""What machina's ``conf/`` offers, found by walking it, for the tests that run over every option (a new YAML is
covered with no test edit): a group's options, the env each policy plays, and a skip for a part whose optional extra
(``pyproject.toml``) is not installed, and only then."""

import functools
import importlib.util
import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from machina.conformance.component import observation_kinds
from machina.errors import ConfigError
from tests.conftest import CONF, ROOT, compose_config


def options(group: str) -> list[str]:
    """The options of a config group: its ``conf/<group>/*.yaml`` files."""
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


def extras() -> dict[str, list[str]]:
    """Each optional extra of ``pyproject.toml`` and the module names of the packages it installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        extra: [re.split(r"[\[<>=;! ]", requirement, maxsplit=1)[0].replace("-", "_") for requirement in requirements]
        for extra, requirements in project["optional-dependencies"].items()
    }


@contextmanager
def skipped_without_its_extra() -> Iterator[None]:
    """Skip the test when the block is refused for an extra (the refusal names ``.[<extra>]``, as machina's envs
    say it) whose packages are not installed; any other refusal fails it."""
    try:
        yield
    except ConfigError as err:
        for extra, modules in extras().items():
            if f".[{extra}]" in str(err) and any(importlib.util.find_spec(module) is None for module in modules):
                pytest.skip(f"needs the {extra} extra: pip install -e '.[{extra}]'")
        raise


@functools.cache
def env_observation_kind(env: str) -> str:
    """The kind of observations (``ObsSpec.kind``) env option ``env`` gives, from one env built with it."""
    with skipped_without_its_extra():
        built = instantiate(compose_config([f"env={env}", "env.num_envs=1"]).env)
    try:
        return built.spec.obs.kind
    finally:
        built.close()


def env_for_policy(policy: str) -> str:
    """The env a policy option plays: the default env when it reads that env's observations, else the first other
    env option (in name order) whose observations it reads."""
    default = compose_config(return_hydra_config=True).hydra.runtime.choices.env
    kinds = observation_kinds(OmegaConf.to_container(OmegaConf.load(CONF / "policy" / f"{policy}.yaml")))
    for env in [default, *(option for option in options("env") if option != default)]:
        if env_observation_kind(env) in kinds:
            return env
    raise AssertionError(f"no env in conf/env gives the observations policy={policy} reads ({kinds})")
