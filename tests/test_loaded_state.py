"""What a loaded file may hold (issue items 6, 7, 11, 15): files are crafted as a careless or hostile user would, and
go through the public paths (load_checkpoint, load_policy / load_teacher, and train's resume). A refusal is one
ConfigError line naming the file (and the entry), it comes before anything is allocated beyond the file's size, and
it leaves every file of the run folder as it was. A checkpoint a stopped run calls good resumes with a finite loss;
a full disk is reported as the OS says it."""

import copy
import errno
import hashlib
import logging
import os
import resource
import shutil
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from machina.errors import ConfigError
from machina.files import checksum
from machina.policy.io import load_policy, load_teacher
from machina.startup.build import build, build_trainer
from machina.training.checkpoint import Checkpointer, load_checkpoint
from tests.conftest import compose_config, sampled
from tests.test_checkpoint import EPOCH, TINY, metrics, random_policy_file, run, run_reporting


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return random_policy_file(tmp_path_factory.mktemp("teacher") / "policy.pt")


@pytest.fixture(scope="module")
def losses(teacher):
    """PPO and a loss with rollout state (the kickstarter's teacher recurrent state)."""
    return ["losses=[ppo,eer_kickstarter]", f"losses.eer_kickstarter.teacher.path={teacher}"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, losses):
    """A run folder after two epochs, a checkpoint after each."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    run(run_dir, *losses)
    return run_dir


def fingerprint(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` but the lock file (taken before any checkpoint is read)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != ".machina.lock")
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def sealed(data: dict, path: Path) -> Path:
    """``data`` saved as machina saves a checkpoint, its checksums recomputed (anyone can): only the checks after
    the checksum can refuse it."""
    torch.save(checksum.seal({**data, "policy": checksum.seal(data["policy"])}), path)
    return path


def edited(source: Path, change) -> dict:
    data = copy.deepcopy(torch.load(source, weights_only=True))
    change(data)
    return data


def refused(load, path: Path) -> str:
    """The one-line ConfigError ``load(path)`` raises, which names the file."""
    with pytest.raises(ConfigError) as error:
        load(path)
    message = str(error.value)
    assert str(path) in message and "\n" not in message, message
    return message


# ---------------------------------------------------------------------------------------------- crafted tensors


def test_a_stride_0_tensor_of_10_to_the_12_elements_is_refused_at_once(trained, tmp_path):
    data = torch.load(trained / "checkpoints" / "checkpoint_000002.pt", weights_only=True)
    data["ranks"][0]["env"]["totals"] = torch.zeros(1).expand(10**12)
    path = tmp_path / "checkpoint_000002.pt"
    torch.save(data, path)  # not re-sealed: the refusal comes before the checksum is computed
    start = time.perf_counter()
    message = refused(load_checkpoint, path)
    assert time.perf_counter() - start < 5
    assert "ranks[0].env.totals claims 1000000000000 elements" in message, message


def test_a_claimed_size_of_gigabytes_is_never_allocated(trained, tmp_path):
    policy = torch.load(trained / "checkpoints" / "policy_000002.pt", weights_only=True)
    name = next(iter(policy["state_dict"]))
    policy["state_dict"][name] = torch.zeros(1).expand(2**29)  # 2 GiB once copied
    path = tmp_path / "policy.pt"
    torch.save(policy, path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    message = refused(load_policy, path)
    assert f"state_dict.{name} claims {2**29} elements" in message, message
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000


class Reduced:
    """Pickles as ``function(*args)``: what a crafted file makes ``torch.load`` call."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


SPARSE = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (10**12,), check_invariants=True)
CRAFTED_FILES = {
    "sparse tensor": ({"x": SPARSE}, "_rebuild_sparse_tensor"),
    "meta tensor": ({"x": torch.empty(10**12, device="meta")}, "_rebuild_meta_tensor_no_storage"),
    "bytearray of 10^12 bytes": ({"x": Reduced(bytearray, 10**12)}, "__builtin__ bytearray"),
    "legacy tensor constructor": ({"x": Reduced(torch.FloatTensor, 10**11)}, "torch FloatTensor"),
    "torch.Tensor of 10^12 elements": ({"x": Reduced(torch.Tensor, 10**12)}, "it calls 'torch Tensor'"),
    "a rebuilt tensor constructed from a size": (
        {"x": Reduced(torch._tensor._rebuild_from_type_v2, torch.Tensor, torch.Tensor, (10**12,), {})},
        "it calls 'torch._tensor _rebuild_from_type_v2' with arguments torch.save never gives it",
    ),
    "complex tensor": ({"x": torch.zeros(3, dtype=torch.complex64)}, "ComplexFloatStorage"),
    "a tensor shared 10^4 times": ({"x": [torch.zeros(2**16)] * 10_000}, "its tensors claim more bytes than the file"),
    "a set": ({"x": {1, 2}}, "__builtin__ set"),
}


@pytest.mark.parametrize("case", CRAFTED_FILES)
def test_crafted_contents_are_refused_before_they_cost_memory(tmp_path, case):
    content, named = CRAFTED_FILES[case]
    path = tmp_path / "checkpoint_000001.pt"
    torch.save({"format": "machina.checkpoint/2", **content}, path)
    for load in (load_checkpoint, load_policy):
        message = refused(load, path)
        assert named in message, message


def test_a_5000_deep_list_is_refused_without_recursion(tmp_path):
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(30_000)  # only to write it: torch.save's pickler recurses
    try:
        torch.save({"format": "machina.checkpoint/2", "config": {"deep": deep}}, tmp_path / "deep.pt")
    finally:
        sys.setrecursionlimit(limit)
    assert "is nested more than 32 levels deep" in refused(load_checkpoint, tmp_path / "deep.pt")


def test_a_compressed_record_is_refused_before_it_expands(trained, tmp_path):
    """A deflated record of zeros is a few KB in the file and any size once read."""
    source = trained / "checkpoints" / "policy_000002.pt"
    path = tmp_path / "policy.pt"
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(path, "w") as crafted:
        for record in original.infolist():
            deflated = "/data/" in record.filename
            data = bytes(2**24) if deflated and record.filename.endswith("/0") else original.read(record)
            crafted.writestr(record.filename, data, zipfile.ZIP_DEFLATED if deflated else zipfile.ZIP_STORED)
    assert path.stat().st_size < 2**24  # smaller than what that one record expands to
    assert "is compressed" in refused(load_policy, path)


def test_a_file_that_is_not_a_zip_archive_is_refused(tmp_path):
    path = tmp_path / "policy.pt"
    path.write_bytes(b"\x80\x02}q\x00." * 10)  # a bare pickle: torch's legacy format, which reads sizes from the file
    assert "not a torch.save zip archive" in refused(load_policy, path)


def test_a_crafted_tensor_in_the_folders_checkpoint_stops_the_rerun_and_changes_nothing(trained, losses, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(trained, folder)
    data = torch.load(folder / "checkpoints" / "checkpoint_000002.pt", weights_only=True)
    data["ranks"][0]["rollout"]["state"]["tensors"]["qrnn_c"] = torch.zeros(1).expand(10**12)
    crafted = folder / "checkpoints" / "checkpoint_000003.pt"
    torch.save(data, crafted)
    before = fingerprint(folder)
    code, message = run_reporting(folder, *losses, epochs=4)
    assert code == 2 and "\n" not in message and str(crafted) in message, message
    assert "qrnn_c claims 1000000000000 elements" in message, message
    assert fingerprint(folder) == before


# ----------------------------------------------------------------------------------- inconsistent loaded state


def setter(*path, value):
    """A change that sets the entry at ``path`` (keys and indices) to ``value``, or to ``value(old)`` if callable."""

    def change(data):
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value(data[path[-1]]) if callable(value) else value

    return change


def filled(index, number):
    """``value(old)``: a copy of the tensor with ``number`` at ``index``."""

    def fill(tensor):
        tensor = tensor.clone()
        tensor[index] = number
        return tensor

    return fill


RANK = ("ranks", 0)
ENV = (*RANK, "env")
OPTIMIZER = ("trainer", "learner", "optimizer", "state", 0)
INCONSISTENT = {
    "history row of a string": (
        setter("trainer", "history", 1, value="abc"),
        "trainer.history[1] is a str, not a mapping of names to numbers",
    ),
    "history row without the summary's keys": (
        setter("trainer", "history", 0, value={"metric/agent_step": EPOCH}),
        "trainer.history[0] lacks overview/reward, overview/sps",
    ),
    "negative epoch": (
        setter("trainer", "epoch", value=-1),
        "trainer.epoch=-1 must be an integer in 0..9223372036854775807",
    ),
    "agent_step as a string": (
        setter("trainer", "agent_step", value="1024"),
        "trainer.agent_step='1024' must be an integer",
    ),
    "ranks as a mapping": (setter("ranks", value={"0": {}}), "ranks is a dict, not a non-empty list"),
    "a rank without RNG states": (setter(*RANK, value=lambda r: {**r, "rng": None}), "ranks[0].rng is a NoneType"),
    "torch RNG state cut short": (
        setter(*RANK, "rng", "torch", value=torch.zeros(3, dtype=torch.uint8)),
        "ranks[0].rng.torch is missing or has the wrong shape",
    ),
    "python RNG position past its state": (
        setter(*RANK, "rng", "python", "state", 624, value=700),
        "ranks[0].rng.python.state[624]=700 must be an integer in 0..624",
    ),
    "numpy RNG position as a float": (
        setter(*RANK, "rng", "numpy", "pos", value=3.5),
        "ranks[0].rng.numpy.pos=3.5 must be an integer",
    ),
    "an agent outside the grid": (
        setter(*ENV, "pos", value=filled((0, 0), 10**6)),
        "ranks[0].env.pos[0, 0] is 1000000, expected an empty interior cell",
    ),
    "an agent on the border wall": (
        setter(*ENV, "pos", value=filled((2, 1), 5 * 23 + 5)),  # bordered cell (0, 0) of the padded 23-wide board
        "ranks[0].env.pos[2, 1] is 120, expected an empty interior cell",
    ),
    "positions as floats": (
        setter(*ENV, "pos", value=lambda pos: pos.float()),
        "ranks[0].env.pos is missing or has the wrong shape or dtype",
    ),
    "an inventory past the cap": (
        setter(*ENV, "inv", value=filled((0, 0, 0), 99)),
        "ranks[0].env.inv[0, 0, 0] is 99, expected >= 0 and <= 4",
    ),
    "a map without its wall border": (
        setter(*ENV, "map", value=filled((1, 0, 3), 0)),
        "ranks[0].env.map[1, 0, 3] is 0, expected 1 (a wall) on the border",
    ),
    "an unknown object type": (setter(*ENV, "map", value=filled((0, 4, 4), 42)), "ranks[0].env.map[0, 4, 4] is 42"),
    "every env ending on the same step": (
        setter(*ENV, "t", value=lambda t: torch.zeros_like(t)),
        "ranks[0].env.t puts 8 envs at one step (they end together), reset_capacity is 1",
    ),
    "a step counter past max_steps": (setter(*ENV, "t", value=filled(0, 500)), "ranks[0].env.t[0] is 500"),
    "a missing env entry": (
        setter(*ENV, value=lambda env: {k: v for k, v in env.items() if k != "vibe"}),
        "ranks[0].env.vibe is missing or has the wrong shape or dtype (absent;",
    ),
    "a reset capacity of 0": (setter(*ENV, "reset_capacity", value=torch.tensor(0)), "reset_capacity is 0"),
    "NaN recurrent state": (
        setter(*RANK, "rollout", "state", "tensors", "qrnn_c", value=filled((0, 0), float("nan"))),
        "ranks[0].rollout.state.tensors.qrnn_c[0, 0] is nan, expected finite",
    ),
    "an episode start of 0.5": (
        setter(*RANK, "rollout", "step", "tensors", "episode_start", value=filled(0, 0.5)),
        "ranks[0].rollout.step.tensors.episode_start holds values other than 0 and 1",
    ),
    "a loss attribute that is not its rollout state": (
        setter(*RANK, "losses", "eer_kickstarter", "_extra_state", "all_reduce", value={"tensor": torch.zeros(1)}),
        "ranks[0].losses.eer_kickstarter._extra_state.all_reduce is not rollout state of this loss",
    ),
    "teacher recurrent state of the wrong width": (
        setter(
            *RANK,
            "losses",
            "eer_kickstarter",
            "_extra_state",
            "_state",
            "tensordict",
            "tensors",
            "qrnn_c",
            value=torch.zeros(32, 5),
        ),
        "ranks[0].losses.eer_kickstarter._extra_state._state.tensordict.tensors.qrnn_c is missing or has the wrong",
    ),
    "infinite weights": (
        setter("policy", "state_dict", value=lambda w: {k: v * float("inf") for k, v in w.items()}),
        "the policy's weights hold NaN or infinite values",
    ),
    "NaN training weights": (
        setter("trainer", "policy", "actor.net.0.bias", value=filled(1, float("nan"))),
        "trainer.policy.actor.net.0.bias[1] is nan, expected finite",
    ),
    "training weights of the wrong shape": (
        setter("trainer", "policy", "actor.net.0.bias", value=torch.zeros(3)),
        "trainer.policy.actor.net.0.bias is missing or has the wrong shape",
    ),
    "training weights that are not tensors": (
        setter("trainer", "policy", "actor.net.0.bias", value=[0.0]),
        "trainer.policy.actor.net.0.bias is a list, not a tensor",
    ),
    "NaN optimizer moments": (
        setter(*OPTIMIZER, "exp_avg", value=lambda m: m * float("nan")),
        "trainer.learner.optimizer.state.0.exp_avg holds NaN or infinite values",
    ),
    "moments of the wrong shape": (
        setter(*OPTIMIZER, "exp_avg", value=torch.zeros(3)),
        "trainer.learner.optimizer.state.0.exp_avg is missing or has the wrong shape",
    ),
    "a negative second moment": (  # state 0: the policy's first parameter, the encoder's row_rows (4-D)
        setter(*OPTIMIZER, "exp_avg_sq", value=filled((0, 0, 0, 0), -1.0)),
        "trainer.learner.optimizer.state.0.exp_avg_sq[0, 0, 0, 0] is -1.0, expected finite and >= 0",
    ),
    "optimizer state without its moments": (
        setter(*OPTIMIZER[:-1], 0, value=lambda entries: {"step": entries["step"]}),
        "trainer.learner.optimizer.state.0 holds ['step'], expected ['exp_avg', 'exp_avg_sq', 'step']",
    ),
    "a run id that is a path": (setter("run_id", value="../../x"), "run_id is '../../x', not a run id"),
    "a config that is a list": (setter("config", value=[1, 2]), "config is a list, not a mapping of names"),
}


@pytest.mark.parametrize("case", sampled(list(INCONSISTENT)))
def test_inconsistent_state_in_the_folders_checkpoint_stops_the_rerun_and_changes_nothing(
    trained, losses, tmp_path, case
):
    """The crafted checkpoint is the folder's newest, so the rerun of the same command resumes from it by itself."""
    change, entry = INCONSISTENT[case]
    folder = tmp_path / "run"
    shutil.copytree(trained, folder)
    data = edited(folder / "checkpoints" / "checkpoint_000002.pt", change)
    crafted = sealed(data, folder / "checkpoints" / "checkpoint_000003.pt")
    before = fingerprint(folder)
    code, message = run_reporting(folder, *losses, epochs=4)
    assert code == 2 and "\n" not in message and str(crafted) in message and entry in message, message
    assert fingerprint(folder) == before


def test_policy_files_and_teachers_with_non_finite_weights_are_refused(trained, losses, tmp_path):
    policy = torch.load(trained / "checkpoints" / "policy_000002.pt", weights_only=True)
    name = next(iter(policy["state_dict"]))
    policy["state_dict"][name] = filled(0, float("nan"))(policy["state_dict"][name])
    path = tmp_path / "policy.pt"
    torch.save(checksum.seal(policy), path)
    for load in (load_policy, load_teacher):
        assert f"NaN or infinite values (state_dict.{name})" in refused(load, path)
    code, message = run_reporting(tmp_path / "run", losses[0], f"losses.eer_kickstarter.teacher.path={path}")
    assert code == 2 and "\n" not in message and str(path) in message and "NaN or infinite" in message, message
    assert not (tmp_path / "run" / "checkpoints").exists()


# ------------------------------------------------------------------------------ checkpoints that are called good


EXPLODING = ["optimizer.lr=1e20", f"experience.minibatch_size={EPOCH}", "learner.update_epochs=1"]


def test_a_checkpoint_called_good_resumes_with_a_finite_loss(tmp_path):
    """One update per epoch at lr 1e20: its weights come out finite (|w| ~ 1e20) and give NaN at the next forward.
    The checkpoint the stopped run names resumes, and its first epoch's losses are finite."""
    run(tmp_path, epochs=1)
    code, message = run_reporting(tmp_path, *EXPLODING, epochs=3)
    assert code == 2 and "after epoch 2, the weights give non-finite losses" in message, message
    good = tmp_path / "checkpoints" / "checkpoint_000001.pt"
    assert f"the last good checkpoint {str(good)!r} is kept" in message, message
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint_*")) == [good.name]
    code, message = run_reporting(tmp_path, *EXPLODING, f"resume={good}", epochs=3)  # it resumes: epoch 2 again
    assert code == 2 and "after epoch 2, the weights give non-finite losses" in message, message
    (row,) = [r for r in metrics(tmp_path) if r["metric/epoch"] == 2]
    losses = {k: v for k, v in row.items() if "/loss_" in k}
    assert losses and all(abs(v) < float("inf") for v in losses.values()), losses


def test_a_first_checkpoint_that_would_not_be_good_is_not_written(tmp_path):
    code, message = run_reporting(tmp_path, *EXPLODING, epochs=2)
    assert code == 2 and "after epoch 1, the weights give non-finite losses" in message, message
    assert "no checkpoint was written" in message and not list((tmp_path / "checkpoints").glob("checkpoint_*"))


# ---------------------------------------------------------------------------------- the checkpoints folder


def test_a_folder_or_a_link_loop_named_like_a_checkpoint_does_not_hide_the_real_one(tmp_path, caplog):
    run(tmp_path, epochs=1)
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "checkpoint_000009.pt").mkdir()
    os.symlink(checkpoints / "checkpoint_000008.pt", checkpoints / "checkpoint_000008.pt")  # a link to itself
    with caplog.at_level(logging.WARNING):
        run(tmp_path, "trainer.keep_checkpoints=1", epochs=2)
    assert [r["metric/epoch"] for r in metrics(tmp_path)] == [1, 2]
    assert (checkpoints / "checkpoint_000002.pt").is_file() and not (checkpoints / "checkpoint_000001.pt").exists()
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "checkpoint_000009.pt: not a regular file" in warnings, warnings
    assert "checkpoint_000008.pt: not a regular file" in warnings, warnings


class FullDisk:
    """A file on a disk with ``room`` bytes left: writes past it fail as the OS fails them (ENOSPC)."""

    def __init__(self, file, room: int):
        self.file, self.room = file, room

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)


def test_a_full_disk_is_reported_as_the_os_reports_it(tmp_path, monkeypatch):
    """The disk fills up in the middle of the checkpoint: torch's zip writer, writing into the file, turns the
    OSError into "unexpected pos"; machina serialises first and writes the bytes itself, so the OS's reason shows."""
    open_ = Path.open

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        file = open_(path, mode, *args, **kwargs)
        checkpoint_2 = path.name.startswith(".checkpoint_000002.pt.") and path.name.endswith(".tmp")
        return FullDisk(file, room=4096) if checkpoint_2 else file

    monkeypatch.setattr(Path, "open", open_on_a_full_disk)
    code, message = run_reporting(tmp_path, epochs=3)
    assert code == 2 and "\n" not in message, message
    assert f"({os.strerror(errno.ENOSPC)})" in message and "unexpected pos" not in message, message
    assert "checkpoint_000002.pt" in message and "checkpoint_000001.pt' is kept" in message, message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if "checkpoint" in p.name) == [
        "checkpoint_000001.pt"
    ]


def test_a_save_keeps_newer_checkpoints_and_prunes_only_older_ones(trained, tmp_path):
    """History is append-only: a save never deletes a checkpoint of a later epoch (a rewound run moves its abandoned
    future aside before it continues, ``machina.run_folder.history``); it prunes older ones down to keep_checkpoints."""
    folder = tmp_path / "checkpoints"
    shutil.copytree(trained / "checkpoints", folder)
    later = folder / "checkpoint_000007.pt"
    shutil.copy(folder / "checkpoint_000002.pt", later)
    cfg = compose_config([*TINY, f"trainer.total_timesteps={3 * EPOCH}"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    parts = build(cfg)
    trainer = build_trainer(cfg, parts, sinks=[])
    trainer.epoch = 3
    with trainer.learner.produced_policy() as produced:
        Checkpointer(folder, resolved["policy"], parts.env.spec, resolved, "id").save(
            trainer.state_dict(), trainer.local_state_dict(), produced, [], keep=1
        )
    assert sorted(p.name for p in folder.glob("checkpoint_*")) == ["checkpoint_000003.pt", later.name]
    assert load_checkpoint(later)["trainer"]["epoch"] == 2


def test_tensors_that_carry_python_attributes_still_load(trained, tmp_path):
    """torch marks a resumed optimizer's state tensors for its compiler (a Python attribute), so torch.save writes
    them through ``_rebuild_from_type_v2``: a genuine checkpoint, which must load."""

    def mark(data):
        for entries in data["trainer"]["learner"]["optimizer"]["state"].values():
            for value in entries.values():
                value._dynamo_static_input_type = "guarded"

    path = sealed(edited(trained / "checkpoints" / "checkpoint_000002.pt", mark), tmp_path / "checkpoint_000002.pt")
    assert load_checkpoint(path)["trainer"]["epoch"] == 2


def test_an_architecture_larger_than_its_weights_is_refused_before_it_is_allocated(trained, tmp_path):
    """A policy file whose architecture claims a 2**30-wide embedding (4 GiB a row) beside its small weights, with
    a recomputed checksum: refused by comparing shapes on the meta device, nothing allocated."""
    policy = torch.load(trained / "checkpoints" / "policy_000002.pt", weights_only=True)
    policy["architecture"]["encoder"]["embed_dim"] = 2**30
    path = tmp_path / "policy.pt"
    torch.save(checksum.seal({k: v for k, v in policy.items() if k != checksum.KEY}), path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    message = refused(load_policy, path)
    assert "its architecture makes encoder.bag.weight of shape" in message and "1073741824" in message, message
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000


def test_a_teacher_that_cannot_be_loaded_is_reported_under_its_setting(trained, tmp_path):
    """Every refusal of a teacher file names the setting that points at it (issue 30 item 15)."""
    damaged = tmp_path / "teacher.pt"
    damaged.write_bytes((trained / "checkpoints" / "policy_000002.pt").read_bytes()[:-100])
    for path in (tmp_path / "missing.pt", damaged):
        message = refused(load_teacher, str(path))
        assert message.startswith(f"path={str(path)!r}: "), message  # build puts the teacher's node in front
