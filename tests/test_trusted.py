"""What a file may name is what the configuration in force names (``machina.files.trusted``), checked from that
definition: every ``_target_`` of a YAML file on the search path, at any depth, and the composed config's; nothing
else is imported, and a file cannot widen the set."""

import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from machina.env.base import Env
from machina.env.factory import env_factory
from machina.errors import ConfigError
from machina.files import checksum
from machina.files.trusted import Trusted, from_search_path, in_force, machina_trusted, walk_targets
from machina.policy.component import Component
from machina.policy.io import load_policy, policy_payload
from machina.startup.build import build
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]
TARGET_LINE = re.compile(r"^\s*(?:-\s*)?_target_:\s*([\w.]+)\s*(?:#.*)?$")


def test_machina_s_own_set_is_every_target_written_in_conf_and_experiments():
    """Read independently, line by line: each ``_target_: <name>`` in conf/ and experiments/."""
    written = set()
    for folder in (ROOT / "conf", ROOT / "experiments"):
        for path in folder.rglob("*.yaml"):
            for line in path.read_text().splitlines():
                match = TARGET_LINE.match(line)
                if match:
                    written.add(match.group(1))
    assert written and machina_trusted().targets == written
    assert "machina.policy.bag_encoder.TokenBagEncoder" in written and "machina.env.machina_1.Machina1Env" in written


def test_targets_are_found_at_any_depth_and_interpolations_and_other_files_are_not(tmp_path):
    (tmp_path / "group").mkdir()
    (tmp_path / "group" / "a.yaml").write_text(
        "x:\n  _target_: lab.A\n  inner:\n    - {_target_: lab.B}\n    - [ {_target_: lab.C} ]\n"
        "y: {_target_: '${oc.env:EVIL}'}\n---\nz: {_target_: lab.D}\n"
    )
    (tmp_path / "notes.txt").write_text("_target_: lab.NotYaml\n")
    (tmp_path / "group" / "loop").symlink_to(tmp_path)  # a link cycle ends
    assert walk_targets(tmp_path) == {"lab.A", "lab.B", "lab.C", "lab.D"}
    trusted = from_search_path([("file://lab", tmp_path)])
    assert trusted.allows("lab.B") and not trusted.allows("lab.NotYaml") and not trusted.allows(None)


def test_an_untrusted_name_is_refused_before_its_module_is_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "side_effect_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Thing: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="which no config on the search path names") as refused:
        machina_trusted().resolve("side_effect_mod.Thing", Component, "policy.pt: architecture.core._target_")
    assert "\n" not in str(refused.value) and not marker.exists()
    # Trusted but of another kind: imported (the user's config names it), refused as not a component.
    with pytest.raises(ConfigError, match="not a machina.policy.component.Component"):
        Trusted(frozenset({"side_effect_mod.Thing"})).resolve("side_effect_mod.Thing", Component, "entry")
    assert marker.exists()


def test_the_composed_config_adds_its_own_targets():
    trusted = in_force({"env": {"_target_": "tests.test_add_env.Corridor"}, "n": [{"_target_": "lab.X"}]})
    assert trusted.allows("tests.test_add_env.Corridor") and trusted.allows("lab.X")
    assert trusted.targets > machina_trusted().targets


def test_a_file_naming_an_env_outside_the_set_is_refused_and_one_inside_is_built(tmp_path):
    settings = {"_target_": "tests.test_add_env.Corridor", "length": 3}
    with pytest.raises(ConfigError, match="which no config on the search path names"):
        env_factory(settings, "cpu")
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "corridor.yaml").write_text("_target_: tests.test_add_env.Corridor\n")
    env = env_factory(settings, "cpu", trusted=from_search_path([("file://lab", tmp_path)]))(seed=0, num_envs=2)
    assert isinstance(env, Env) and env.length == 3


def test_a_policy_file_naming_a_trusted_class_of_the_wrong_kind_is_refused(tmp_path):
    """A file may name a trusted env class in a policy slot: refused as not a component, before any build."""
    cfg = compose_config(["debug=tiny", "wandb=disabled"])
    parts = build(cfg)
    payload = policy_payload(parts.policy, OmegaConf.to_container(cfg.policy, resolve=True), parts.env.spec.obs)
    payload["architecture"]["core"]["_target_"] = "machina.env.machina_1.Machina1Env"
    path = tmp_path / "policy.pt"
    torch.save(checksum.seal(payload), path)
    with pytest.raises(ConfigError, match=r"architecture\.core\._target_ is 'machina\.env\.machina_1\.Machina1Env'"):
        load_policy(path)
