"""Safe files and safe run folders (issue 14): a file cannot run code, a damaged file is refused, a refused resume
changes nothing, one run per folder, a foreign checkpoint cannot mix two runs, the user's optimizer settings win on
resume, non-finite weights are never checkpointed, and the set of losses may change on resume."""

import copy
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile

import pytest
import torch
from omegaconf import OmegaConf
from torch.optim.optimizer import register_optimizer_step_post_hook

from machina.errors import ConfigError
from machina.files import checksum
from machina.policy.io import load_policy
from machina.startup.build import build, build_trainer
from machina.training.checkpoint import Checkpointer, load_checkpoint
from tests.commands import run_script
from tests.conftest import ROOT, compose_config
from tests.test_checkpoint import EPOCH, TINY, metrics, random_policy_file, run, run_reporting

# What an attacker's policy file puts into its architecture: (slot, argument or None for the slot itself, value)
# and the entry the refusal must name. Each would write MARKER if it were called.
MARKER = "marker.txt"


def open_marker(marker):
    return {"_target_": "builtins.open", "file": str(marker), "mode": "w"}


PAYLOADS = {
    "builtin nested in an argument": (
        lambda m: ("encoder", "embed_dim", open_marker(m)),
        "architecture.encoder.embed_dim",
    ),
    "builtin as a slot": (lambda m: ("encoder", None, open_marker(m)), "architecture.encoder._target_"),
    "exec inside a list": (
        lambda m: ("actor", "hidden", [32, {"_target_": "builtins.exec", "_args_": [f"open({str(m)!r}, 'w')"]}]),
        "architecture.actor.hidden[1]",
    ),
    "pathlib": (
        lambda m: (
            "critic",
            None,
            {
                "_target_": "pathlib.Path.write_text",
                "self": {"_target_": "pathlib.Path", "_args_": [str(m)]},
                "data": "pwned",
            },
        ),
        "architecture.critic._target_",
    ),
}


def craft(data: dict, make, marker, path):
    """A copy of a real file's ``data`` with a payload in its policy architecture, sealed with a valid checksum (an
    attacker can compute one too) and saved as a real ``torch.save`` file that ``weights_only=True`` accepts."""
    data = copy.deepcopy(data)
    policy = data.get("policy", data)
    slot, argument, value = make(marker)
    if argument is None:
        policy["architecture"][slot] = value
    else:
        policy["architecture"][slot][argument] = value
    if "policy" in data:
        data["policy"] = checksum.seal(policy)
    torch.save(checksum.seal(data), path)
    torch.load(path, weights_only=True)
    return path


def flip_tensor_bytes(path, out, count=100):
    """Copy ``path`` to ``out`` with ``count`` bytes flipped inside the data of its largest tensor."""
    with zipfile.ZipFile(path) as archive:
        entry = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[entry.header_offset + 26 : entry.header_offset + 30])
    start = entry.header_offset + 30 + name_len + extra_len + entry.file_size // 2
    for i in range(start, start + count):
        raw[i] ^= 0xFF
    out.write_bytes(bytes(raw))
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder after two epochs of PPO (a checkpoint after each)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    run(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    return random_policy_file(tmp_path_factory.mktemp("policy") / "policy.pt")


def snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes, but the lock file (created before the checkpoint is read)."""
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != ".machina.lock"]
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


@pytest.mark.parametrize("payload", PAYLOADS)
def test_load_policy_builds_only_allowed_classes_from_plain_values(policy_file, tmp_path, payload):
    make, entry = PAYLOADS[payload]
    marker = tmp_path / MARKER
    bad = craft(torch.load(policy_file, weights_only=True), make, marker, tmp_path / "bad.pt")
    with pytest.raises(ConfigError) as refused:
        load_policy(bad)
    message = str(refused.value)
    assert str(bad) in message and f"{entry} " in message and "\n" not in message, message
    assert not marker.exists()
    policy, _ = load_policy(policy_file)  # the genuine file still loads, with full_log_probs off unless asked
    assert not policy.action_probs.emit_full_log_probs
    assert load_policy(policy_file, emit_full_log_probs=True)[0].action_probs.emit_full_log_probs


def test_eval_and_teacher_refuse_a_payload_and_write_nothing(policy_file, tmp_path):
    marker = tmp_path / MARKER
    bad = craft(torch.load(policy_file, weights_only=True), PAYLOADS["pathlib"][0], marker, tmp_path / "bad.pt")
    evaluated = run_script("eval.py", f"checkpoint={bad}", "episodes=2", f"hydra.run.dir={tmp_path / 'e'}")
    output = evaluated.stdout + evaluated.stderr
    assert evaluated.returncode == 2 and "architecture.critic._target_" in output, output[-2000:]
    assert not marker.exists() and not (tmp_path / "e" / "eval.json").exists()

    teacher = [
        "losses=[ppo,eer_kickstarter]",
        f"losses.eer_kickstarter.teacher.path={bad}",
        f"hydra.run.dir={tmp_path / 't'}",
    ]
    trained = run_script("train.py", *TINY, f"trainer.total_timesteps={EPOCH}", *teacher)
    output = trained.stdout + trained.stderr
    assert trained.returncode == 2 and "architecture.critic._target_" in output, output[-2000:]
    assert not marker.exists() and not (tmp_path / "t" / "checkpoints").exists()


@pytest.mark.parametrize("payload", ["builtin nested in an argument", "exec inside a list"])
def test_resume_refuses_a_checkpoint_with_a_payload(trained, tmp_path, payload):
    make, entry = PAYLOADS[payload]
    marker = tmp_path / MARKER
    good = trained / "checkpoints" / "checkpoint_000002.pt"
    bad = craft(torch.load(good, weights_only=True), make, marker, tmp_path / "checkpoint_000002.pt")
    code, message = run_reporting(tmp_path / "run", f"resume={bad}", epochs=3)
    assert code == 2 and str(bad) in message and f"{entry} " in message, message
    assert not marker.exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_damaged_or_unsealed_files_are_refused(trained, tmp_path):
    for name in ("checkpoint_000002.pt", "policy_000002.pt"):
        damaged = flip_tensor_bytes(trained / "checkpoints" / name, tmp_path / name)
        with pytest.raises(ConfigError, match="does not match its checksum") as refused:
            load_checkpoint(damaged) if name.startswith("checkpoint") else load_policy(damaged)
        assert str(damaged) in str(refused.value)
    unsealed = tmp_path / "unsealed.pt"
    data = torch.load(trained / "checkpoints" / "policy_000002.pt", weights_only=True)
    torch.save({k: v for k, v in data.items() if k != "checksum"}, unsealed)
    with pytest.raises(ConfigError, match="predates checksums"):
        load_policy(unsealed)


def test_a_refused_resume_changes_nothing_in_the_run_folder(trained, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(trained, folder)
    before = snapshot(folder)
    resume = f"resume={folder / 'checkpoints' / 'checkpoint_000001.pt'}"
    code, message = run_reporting(folder, resume, "policy.core.hidden_size=16", epochs=3)
    assert code == 2 and "policy.core.hidden_size: 32 -> 16" in message, message
    assert snapshot(folder) == before


def test_a_foreign_checkpoint_continues_only_into_a_fresh_folder(trained, tmp_path):
    other = tmp_path / "other"
    run(other, "system.seed=7", epochs=1)
    before = snapshot(other)
    foreign = f"resume={trained / 'checkpoints' / 'checkpoint_000001.pt'}"
    code, message = run_reporting(other, foreign, epochs=3)
    assert code == 2 and "another run's checkpoint" in message and "metrics.jsonl" in message, message
    assert snapshot(other) == before
    fresh = tmp_path / "fresh"
    run(fresh, foreign, epochs=2)
    assert [r["metric/epoch"] for r in metrics(fresh)] == [2]


def test_a_folder_in_use_is_refused_and_a_killed_holder_does_not_block(trained, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(trained, folder)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from machina.run_folder.run_lock import RunLock\nwith RunLock({str(folder)!r}): input()",
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        lock = folder / ".machina.lock"
        while not (lock.is_file() and lock.read_text().startswith(f"PID {holder.pid} ")):
            assert holder.poll() is None
            time.sleep(0.05)
        before = snapshot(folder)
        code, message = run_reporting(folder, epochs=3)
        assert code == 2 and f"is in use by PID {holder.pid} on host" in message, message
        assert snapshot(folder) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    run(folder, epochs=3)  # the lock died with its holder: the same command resumes
    assert [r["metric/epoch"] for r in metrics(folder)] == [1, 2, 3]
    assert (folder / ".machina.lock").read_text().startswith(f"PID {os.getpid()} ")


def test_resume_takes_the_new_optimizer_settings_and_the_saved_moments(trained, caplog):
    source = trained / "checkpoints" / "checkpoint_000002.pt"
    data = load_checkpoint(source)
    cfg = compose_config([*TINY, f"trainer.total_timesteps={3 * EPOCH}", "optimizer.lr=0.0005", "optimizer.eps=1e-7"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    parts = build(cfg)
    trainer = build_trainer(cfg, parts, sinks=[])
    checkpointer = Checkpointer(trained / "checkpoints", resolved["policy"], parts.env.spec, resolved, "id")
    with caplog.at_level(logging.WARNING):
        checkpointer.restore(trainer, data, source)
    (group,) = trainer.learner.optimizer.param_groups
    assert (group["lr"], group["eps"]) == (0.0005, 1e-7)
    saved = data["trainer"]["learner"]["optimizer"]["state"]
    for index, param in enumerate(group["params"]):
        assert torch.equal(trainer.learner.optimizer.state[param]["exp_avg"], saved[index]["exp_avg"])
        assert torch.equal(trainer.learner.optimizer.state[param]["exp_avg_sq"], saved[index]["exp_avg_sq"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    trained_lr = OmegaConf.load(trained / "resolved_config.yaml").optimizer.lr
    assert any(w.endswith(f"optimizer.lr: {trained_lr} -> 0.0005") for w in warnings), warnings
    assert any(w.endswith(f"trainer.total_timesteps: {2 * EPOCH} -> {3 * EPOCH}") for w in warnings), warnings


class Explode:
    """A global optimizer step hook that, at its ``at``-th step, puts an infinity into the first parameter (the
    weights blow up in the epoch's last step, after its losses were computed) or into the optimizer's state."""

    def __init__(self, at: int, target: str):
        self.at, self.target, self.steps = at, target, 0

    def __call__(self, optimizer, args, kwargs):
        self.steps += 1
        if self.steps == self.at:
            param = optimizer.param_groups[0]["params"][0]
            tensor = param if self.target == "parameters" else optimizer.state[param]["exp_avg_sq"]
            with torch.no_grad():
                tensor.view(-1)[0] = float("inf")


@pytest.mark.parametrize(
    "target, expected, logged",
    [
        ("parameters", "non-finite policy parameters after epoch 2", [1]),
        ("optimizer state", "after epoch 2, non-finite values in optimizer.0.exp_avg_sq", [1, 2]),
    ],
)
def test_non_finite_weights_or_optimizer_state_are_never_checkpointed(tmp_path, target, expected, logged):
    hook = register_optimizer_step_post_hook(Explode(at=2, target=target))
    try:  # one optimizer step per epoch: one minibatch, one pass
        code, message = run_reporting(
            tmp_path, f"experience.minibatch_size={EPOCH}", "learner.update_epochs=1", epochs=3
        )
    finally:
        hook.remove()
    assert code == 2 and expected in message and "checkpoint_000001.pt" in message, message
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint_*")) == ["checkpoint_000001.pt"]
    assert [r["metric/epoch"] for r in metrics(tmp_path)] == logged


KICKSTARTER = ["losses=[ppo,eer_kickstarter]", "losses.eer_kickstarter.teacher.path={teacher}"]


@pytest.mark.parametrize(
    "first, then",
    [
        (["losses=[ppo,supervisor]"], ["losses=[ppo]"]),  # full_log_probs and the env's teacher turn off
        (["losses=[ppo]"], KICKSTARTER),  # full_log_probs turns on (the teacher is a network, not the env's)
        (["losses=[ppo]"], ["losses=[ppo,supervisor]"]),  # the env's teacher turns on: recomputed from the state
    ],
    ids=["remove supervisor", "add eer_kickstarter", "add supervisor"],
)
def test_resume_with_another_set_of_losses(policy_file, tmp_path, first, then):
    """emit_full_log_probs follows the losses, so it changes with them; a real architecture change is still refused."""
    first, then = ([o.format(teacher=policy_file) for o in overrides] for overrides in (first, then))
    run(tmp_path, *first, epochs=1)
    run(tmp_path, *then, epochs=2)
    assert [r["metric/epoch"] for r in metrics(tmp_path)] == [1, 2]
    saved = load_checkpoint(tmp_path / "checkpoints" / "checkpoint_000002.pt")["config"]["losses"]
    assert f"losses=[{','.join(saved)}]" == then[0]
    code, message = run_reporting(tmp_path, *then, "policy.core.hidden_size=16", epochs=3)
    assert code == 2 and "policy.core.hidden_size: 32 -> 16" in message, message


def test_only_the_builder_turns_config_into_code():
    """Grep-proof of "everything read from a file is data" (issue 30): the calls that import or call what a config
    names, or resolve its interpolations, appear only where the config is the composed one (conf/ and the command
    line) or a file of this repository, or where a name was first found trusted (``machina.files.trusted``); every
    loader of a file from disk goes through that instead."""
    calls = re.compile(r"\b(instantiate|get_class|get_object|locate|import_module)\(|OmegaConf\.load\(|resolve=True")
    allowed = {
        "machina/startup/build.py",  # the composed config: the one place that instantiates it
        "machina/startup/refusals.py",  # the composed config's integer sizes, named when the parts do not fit
        "machina/startup/resolvers.py",  # ${consumes:...} during composition: the composed losses' classes
        "machina/startup/validation.py",  # start-up type checks of the composed config's constructors
        "machina/run.py",  # the composed config resolved once, for the checks and the record
        "machina/conformance/loss.py",  # the kit's composed config resolved once for its checkpointer, as machina.run
        "machina/speed/policy.py",  # conf/policy/*.yaml of this repository
        "eval.py",  # env=<name> on eval's command line: the composed env group
        "machina/files/trusted.py",  # a name a file holds, imported only once the configuration in force names it
        "machina/env/mettagrid/game.py",  # the game command's module:function argument: a command line's choice
        "machina/env/pettingzoo/ids.py",  # env.id: the composed config's, or from a file only if file_may_name allows
        "machina/docs_reference/config.py",  # the classes conf/ of this repository names, for their docstrings
        "machina/docs_reference/flags.py",  # machina's own commands, by the fixed list of its COMMANDS
    }
    found = set()
    for path in [*sorted((ROOT / "machina").rglob("*.py")), ROOT / "eval.py", ROOT / "train.py"]:
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        code = re.sub(r'""".*?"""', "", code, flags=re.S)
        if calls.search(code):
            found.add(str(path.relative_to(ROOT)))
    assert found == allowed
