"""Generated damage fed to every loader and every command that reads a run folder (issue 30): random byte flips,
truncations, type swaps and planted values (nested ``_target_`` calls, interpolations and resolvers, tensors that
claim huge sizes) in a real run folder's checkpoint, policy file, YAML files and metrics.jsonl.

Whatever the damage, a loader returns or raises ConfigError (never another exception), and a command either works
or exits with 2 and one line; never a traceback, never code run (a marker file the payloads would write stays
absent), and no pre-existing file changes. Which mutation hits which byte is drawn from a fixed seed, so a failure
reproduces; ``FUZZ_SEED=<n>`` draws another set.
"""

import copy
import hashlib
import io
import os
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from machina.env.factory import check_env_settings
from machina.errors import ConfigError
from machina.files import checksum, metrics_file
from machina.files.stored_config import plain_mapping, read_yaml
from machina.policy.io import load_policy, load_teacher
from machina.run_folder.reading import read_run
from machina.training.checkpoint import load_checkpoint
from tests.commands import run_module, run_script
from tests.conftest import sampled
from tests.test_checkpoint import EPOCH, TINY, run

SEED = int(os.environ.get("FUZZ_SEED", "30"))
MARKER = "pwned.txt"
CHECKPOINT = "checkpoints/checkpoint_000002.pt"
POLICY = "checkpoints/policy_000002.pt"
YAMLS = ("resolved_config.yaml", ".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A real two-epoch run folder (checkpoints at both epochs), written once and only copied by the tests."""
    folder = tmp_path_factory.mktemp("fuzz") / "run"
    run(folder, epochs=2)
    # Hydra's record, as train.py writes it, so the YAML readers have every file to read.
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text((folder / "resolved_config.yaml").read_text())
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(TINY)))
    (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"mode": "RUN", "job": {"name": "train"}}}))
    return folder


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# Values a type swap or a plant puts in place of a stored one: other types, extremes, code and interpolations.
def payloads(marker: Path) -> list:
    call = {"_target_": "pathlib.Path.write_text", "self": {"_target_": "pathlib.Path", "_args_": [str(marker)]}}
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    return [
        "x",
        -1,
        2**70,
        float("nan"),
        None,
        True,
        [],
        {},
        [1, "a", None],
        {"_target_": "builtins.exec", "_args_": [f"open({str(marker)!r}, 'w')"]},
        {**call, "data": "x"},
        "${oc.env:HOME}",
        "${consumes:full_log_probs,{a:{_target_: fuzz_payload.Loss}}}",
        deep,
        torch.tensor(float("nan")),
        torch.zeros(1).expand(10**9),
        torch.zeros(3, dtype=torch.complex64),
        torch.empty(2, 2, device="meta"),
    ]


def paths(node, prefix=()) -> list[tuple]:
    """Every path (a tuple of keys and indices) to a value inside nested dicts and lists, the checksum excluded."""
    found = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if prefix == () and key == checksum.KEY:
            continue
        found.append((*prefix, key))
        if len(prefix) < 8:
            found += paths(value, (*prefix, key))
    return found


def put(node, path: tuple, value) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def swap_in_torch_file(data: bytes, rng: random.Random, marker: Path) -> bytes:
    """A value deep inside the file replaced by one of ``payloads``, then sealed again: a deliberate edit that the
    checksum cannot see."""
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    edited = copy.deepcopy(loaded)
    value = rng.choice(payloads(marker))
    put(edited, rng.choice(paths(edited)), value)
    # A tensor with no data (meta) or claiming more than it holds (stride 0) cannot be digested without allocating
    # what it claims: it goes in with a made-up checksum, which the loader must not get as far as comparing.
    honest = not (isinstance(value, torch.Tensor) and (value.is_meta or not value.is_contiguous()))
    sealed = checksum.seal(edited) if honest else {**edited, checksum.KEY: "0" * 64}
    out = io.BytesIO()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # pickling the 5,000-deep list; an attacker's pickler has no limit at all
    try:
        torch.save(sealed, out)
    finally:
        sys.setrecursionlimit(limit)
    return out.getvalue()


def swap_in_yaml(data: bytes, rng: random.Random, marker: Path) -> bytes:
    loaded = yaml.safe_load(data)
    if not isinstance(loaded, dict | list) or not paths(loaded):
        return data + b"\n${oc.env:HOME}: 1\n"
    value = rng.choice([p for p in payloads(marker) if not isinstance(p, torch.Tensor)])
    if isinstance(value, list) and len(value) == 1:  # the 5,000-deep list, as deep as a YAML dumper writes
        value = [[[[[[[[[[["deep"]]]]]]]]]]]
    put(loaded, rng.choice(paths(loaded)), value)
    return yaml.safe_dump(loaded).encode()


def damage_metrics(data: bytes, rng: random.Random, marker: Path) -> bytes:
    lines = data.splitlines(keepends=True)
    bad = rng.choice([b"\xff\xfe{\n", b"[1, 2]\n", b'{"metric/epoch": "x"}\n', b"{", b"\n\n", b'"just a string"\n'])
    lines.insert(rng.randrange(len(lines) + 1), bad)
    return b"".join(lines)


MUTATIONS: dict[str, list[tuple[str, Callable]]] = {
    CHECKPOINT: [("flip", flip), ("truncate", truncate), ("swap", swap_in_torch_file)],
    POLICY: [("flip", flip), ("truncate", truncate), ("swap", swap_in_torch_file)],
    **{name: [("flip", flip), ("truncate", truncate), ("swap", swap_in_yaml)] for name in YAMLS},
    "metrics.jsonl": [("flip", flip), ("truncate", truncate), ("lines", damage_metrics)],
}


def variants(count: int, seed: int) -> list[tuple[str, str, int]]:
    """``count`` (file, mutation, seed) triples drawn from ``seed``, every file and mutation kind covered."""
    rng = random.Random(seed)
    kinds = [(file, name) for file, mutations in MUTATIONS.items() for name, _ in mutations]
    chosen = kinds * (count // len(kinds)) + rng.sample(kinds, count % len(kinds))
    return [(file, name, rng.randrange(2**31)) for file, name in chosen]


def damaged_copy(pristine: Path, scratch: Path, file: str, mutation: str, seed: int) -> Path:
    folder = scratch / "run"
    shutil.copytree(pristine, folder)
    (scratch / "fuzz_payload.py").write_text(f"open({str(scratch / MARKER)!r}, 'w').write('imported')\n")
    apply = dict(MUTATIONS[file])[mutation]
    rng = random.Random(seed)
    target = folder / file
    data = target.read_bytes()
    args = (rng,) if apply in (flip, truncate) else (rng, scratch / MARKER)
    target.write_bytes(apply(data, *args))
    return folder


def loaders(folder: Path) -> dict[str, Callable[[], object]]:
    """Every loader of a run folder's files, called as the commands call them."""

    def stored_env():
        return check_env_settings(plain_mapping(read_yaml(folder / "resolved_config.yaml"), "x").get("env"), "x")

    return {
        "load_checkpoint": lambda: load_checkpoint(folder / CHECKPOINT),
        "load_policy": lambda: load_policy(folder / POLICY),
        "load_teacher": lambda: load_teacher(str(folder / POLICY)),
        "checkpoint_as_policy": lambda: load_policy(folder / CHECKPOINT),
        "stored env": stored_env,
        "metrics": lambda: metrics_file.read_lines(folder / "metrics.jsonl"),
        "read_run": lambda: read_run(folder),
    }


@pytest.mark.parametrize(("file", "mutation", "seed"), sampled(variants(60, SEED)))
def test_every_loader_refuses_damage_with_a_config_error_and_runs_nothing(pristine, tmp_path, file, mutation, seed):
    folder = damaged_copy(pristine, tmp_path, file, mutation, seed)
    before = snapshot(folder)
    sys.path.insert(0, str(tmp_path))  # a resolver naming fuzz_payload could import it: it must not be asked to
    try:
        for name, load in loaders(folder).items():
            try:
                load()
            except ConfigError as err:
                assert "\n" not in str(err), f"{name}: {err}"
            except Exception as err:  # noqa: BLE001 - the point: anything but ConfigError is a failure
                pytest.fail(f"{name} on {file} ({mutation}, seed {seed}) raised {type(err).__name__}: {err}")
    finally:
        sys.path.remove(str(tmp_path))
    assert not (tmp_path / MARKER).exists()
    assert "fuzz_payload" not in sys.modules
    assert snapshot(folder) == before


def commands(folder: Path, scratch: Path) -> dict[str, Callable[[], object]]:
    """Every command that reads a run folder, run from ``scratch`` in this process (``tests.commands``), each writing
    only inside ``scratch``."""
    return {
        "resume": lambda: run_script(
            "train.py",
            *TINY,
            f"trainer.total_timesteps={3 * EPOCH}",
            f"resume={folder}",
            f"hydra.run.dir={scratch / 'resumed'}",
            cwd=scratch,
        ),
        "eval": lambda: run_script(
            "eval.py",
            f"checkpoint={folder}",
            "episodes=2",
            "replay=false",
            f"hydra.run.dir={scratch / 'eval'}",
            cwd=scratch,
        ),
        "compare": lambda: run_module(
            "machina.compare", str(folder), "--out", str(scratch / "compare.png"), cwd=scratch
        ),
        "plot": lambda: run_module("machina.plot", str(folder), "--out", str(scratch / "plot.png"), cwd=scratch),
    }


@pytest.mark.slow
@pytest.mark.parametrize(("file", "mutation", "seed"), variants(8, SEED + 1))
def test_every_command_on_a_damaged_folder_works_or_refuses_in_one_line(
    pristine, tmp_path, monkeypatch, file, mutation, seed
):
    folder = damaged_copy(pristine, tmp_path, file, mutation, seed)
    before = snapshot(folder)
    # A resolver naming fuzz_payload could import it (as PYTHONPATH would let it): it must not be asked to.
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, command in commands(folder, tmp_path).items():
        result = command()
        output = result.output
        where = f"{name} on {file} ({mutation}, seed {seed}): exit {result.returncode}\n{output[-3000:]}"
        assert result.returncode in (0, 2), where
        assert "Traceback" not in output, where
        if result.returncode == 2:
            errors = [line for line in output.splitlines() if "Error" in line and ":" in line]
            assert len(errors) == 1, where
    assert not (tmp_path / MARKER).exists()
    assert "fuzz_payload" not in sys.modules
    assert snapshot(folder) == before
