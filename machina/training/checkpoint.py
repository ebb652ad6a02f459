"""Checkpoints: the whole training state at an epoch boundary, written atomically, loaded without running code.

The Checkpointer only reads and writes files: their layout, the ranks' state gathered to rank 0, atomic writes and
pruning. The state comes from the parts (``Trainer.state_dict``, ``Trainer.local_state_dict``), and whether it is
good to resume from is theirs to say (``Trainer.problems``); the Checkpointer asks, and refuses to write.

Layout of ``<run_dir>/checkpoints/`` (epochs zero-padded to 6 digits, so names sort by epoch):
    checkpoint_<epoch>.pt   the training state; the last ``trainer.keep_checkpoints`` are kept
    policy_<epoch>.pt       the policy file of that epoch (``machina.policy.io``), all kept: teachers
                            (``losses.eer_kickstarter.teacher.path``) and evaluation read them
A checkpoint is a dict of plain data and tensors, so ``torch.load(weights_only=True)`` reads it:
    format              "machina.checkpoint/3"
    policy              a policy file's payload (architecture + weights): the policy the run produces
                        (``Learner.produced_policy``: with learner.average_horizon, the average of the weights), the
                        same as policy_<epoch>.pt; what eval.py and teachers read
    trainer             Trainer.state_dict(): epoch and agent_step after the epoch's update, the per-epoch history
                        (agent_step / reward / SPS, so the run summary spans resumes), the policy's own (training)
                        weights, and the learner's optimizer and weight average (its count and weights)
    ranks               per rank, Trainer.local_state_dict() (env, rollout, losses) and its RNG states (torch,
                        CUDA, numpy, python), gathered by rank 0, which alone writes
    run_id              the run's own id (the sinks' ``RunInfo.id``; W&B continues the run of that id)
    config              the resolved config of the run that wrote it
    checksum            sha256 of everything above (``machina.files.checksum``), verified on load
A resume restores the training state from ``trainer`` and ``ranks``; the ``policy`` entry is for readers of the
produced policy. A ``machina.checkpoint/2`` file (its ``policy`` the produced policy, the training weights inside
``trainer.learner.average`` when averaging, ``wandb_run_id`` for ``run_id``) is read as this layout
(``checkpoint_schema.from_format_2``), so runs written in it resume.

A checkpoint is written only when every part calls its state good (``Trainer.problems``: finite parameters,
optimizer state and average, and finite losses with the weights, ``Learner.problems``); so the checkpoint a stopped
run names as its last good one is one whose weights evaluate to finite losses. Files are serialised in memory and
then written atomically (``machina.files.atomic``), so a failed write reports the OS's reason (a full disk) and
leaves the previous checkpoint the newest. History is append-only: a save prunes only checkpoints older than
``trainer.keep_checkpoints`` (``machina.run_folder.history`` moves an abandoned future aside before a rewound run
continues).

Loading trusts nothing in the file: it is read as bounded plain data (``machina.files.torch_file``), its checksum must
match, its structure and types must be a checkpoint's (``checkpoint_schema``), and each part checks the state it
restores (``Checkpointer.restore``); every refusal is a ConfigError before the run folder changes. Schedules are pure
functions of agent_step, so the counters restore them. The experience buffer is not saved: at an epoch boundary every
row of it is rewritten before it is read again.
"""

import io
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from machina.env.spec import EnvSpec
from machina.errors import ConfigError, TrainingStopped, one_line
from machina.files import checksum
from machina.files.atomic import atomic_write
from machina.files.saved_state import within
from machina.files.snapshot import capture_rng, restore_rng
from machina.files.trusted import Trusted
from machina.policy.allowlist import architecture
from machina.policy.io import check_policy_data, policy_payload, read_checkpoint_file
from machina.training import checkpoint_schema, distributed
from machina.training.checkpoint_schema import FORMAT, FORMAT_2

log = logging.getLogger(__name__)

CHECKPOINT = re.compile(r"checkpoint_(\d+)\.pt")


class Checkpointer:
    """Writes checkpoints into ``directory`` and restores a trainer from one.

    Args:
        directory: ``<run_dir>/checkpoints``; created, and checked to be writable, by ``prepare``.
        architecture: the resolved ``policy`` config, enough to rebuild the policy (stored without its run-time
            flag ``action_probs.emit_full_log_probs``: ``machina.policy.allowlist.architecture``).
        spec: the env's spec: its observation spec is stored with the policy, its action count checked on resume.
        config: the resolved run config, stored for the record and compared on resume.
        run_id: the run's own id (``RunInfo.id``).
    """

    def __init__(
        self, directory: Path, architecture: dict[str, Any], spec: EnvSpec, config: dict[str, Any], run_id: str | None
    ):
        self.directory = Path(directory)
        self.architecture, self.spec, self.config, self.run_id = architecture, spec, config, run_id
        self.latest: Path | None = latest_checkpoint(self.directory)

    def prepare(self) -> None:
        """Create the folder and check it is writable; called by the writer (rank 0) once a resume has been accepted
        (before that, nothing in the run folder may change)."""
        probe = self.directory / ".write_test"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
            # A kill during a write leaves only a temp file behind (never a half checkpoint); drop it.
            for stale in self.directory.glob(".*.tmp"):
                stale.unlink()
        except OSError as err:
            raise ConfigError(
                f"cannot write checkpoints to {str(self.directory)!r} ({err.strerror or err}); make the run folder "
                "writable or choose another with hydra.run.dir=PATH"
            ) from None

    def save(self, state: dict, local: dict, produced: nn.Module, problems: list[str], keep: int) -> Path:
        """Write ``policy_<epoch>.pt`` (of ``produced``, the policy the run produces) then ``checkpoint_<epoch>.pt``
        (the commit point), and keep the last ``keep`` checkpoints. ``state`` is ``Trainer.state_dict()``, ``local``
        this rank's ``Trainer.local_state_dict()``, ``problems`` this rank's ``Trainer.problems()``. Problems on any
        rank, or a failed write (full disk, folder no longer writable), stop training naming the epoch or the file;
        the previous checkpoint stays the newest. Under torchrun every rank calls this at the same epoch (all take
        the same decision) and rank 0 writes every rank's state."""
        epoch = state["epoch"]
        path = self.directory / f"checkpoint_{epoch:06d}.pt"
        # All ranks write or none: a rank whose own rows give finite losses stops with the others.
        if distributed.agree_max(int(bool(problems))):
            raise TrainingStopped(
                f"after epoch {epoch}, {'; '.join(problems) or 'another rank reports a state not good to resume'}: "
                f"checkpoint {str(path)!r} is not written; {self.after_stop()}; lower optimizer.lr, the loss's "
                "coefficients or learner.max_grad_norm"
            )
        ranks = distributed.gather_to_main({**local, "rng": capture_rng()})
        if ranks is None:  # not rank 0
            self.latest = path
            return path
        payload = policy_payload(produced, self.architecture, self.spec.obs)
        data = {
            "format": FORMAT,
            "policy": payload,
            "trainer": state,
            "ranks": ranks,
            "run_id": self.run_id,
            "config": self.config,
        }
        try:
            write_file(self.directory / f"policy_{epoch:06d}.pt", payload)
            write_file(path, checksum.seal(data))
        except OSError as err:
            reason = one_line(err.strerror or err)
            raise TrainingStopped(
                f"cannot write checkpoint {str(path)!r} ({reason}); free disk space or make the folder writable: "
                f"{self.after_stop()}"
            ) from None
        self.latest = path
        older = [p for number, p in checkpoints(self.directory) if number <= epoch]
        for old in older[:-keep]:
            old.unlink()
        log.info("checkpoint %s (epoch %d, agent step %d)", path, epoch, state["agent_step"])
        return path

    def restore(self, trainer, data: dict[str, Any], source: Path) -> None:
        """Load ``data`` (read from ``source`` by ``load_checkpoint``) into ``trainer`` (its ``load_state_dict``
        and ``load_local_state_dict``); refuse a checkpoint it cannot continue, naming the settings that differ or
        the entry that is wrong (a resume may be automatic: say which file it was). Each part checks the state it
        restores (shapes, dtypes, value ranges), so every refusal comes here, before the run folder changes.

        The optimizer's state (moment estimates, step counts) comes from the checkpoint; its hyper-parameters (lr,
        eps, betas, weight decay: every param_group entry but ``params``) are this run's, so a changed
        ``optimizer.lr`` takes effect. ``policy.action_probs.emit_full_log_probs`` is not architecture (it follows
        the enabled losses), so the set of losses may change on resume."""
        policy, where = data["policy"], f"the checkpoint {str(source)!r}"
        ours = architecture(self.architecture)
        if policy["architecture"] != ours:
            raise ConfigError(
                f"{where} was trained with another policy architecture ("
                + "; ".join(config_diff(policy["architecture"], ours, "policy"))
                + "); resume with the checkpoint's policy settings or start a new run folder (hydra.run.dir)"
            )
        if policy["num_actions"] != self.spec.num_actions:
            raise ConfigError(
                f"{where} has a policy with {policy['num_actions']} actions but the env has "
                f"{self.spec.num_actions}; resume with the checkpoint's env.num_vibes"
            )
        ranks = data["ranks"]
        own = ranks[distributed.rank()] if distributed.rank() < len(ranks) else None
        try:
            with within("trainer."):
                trainer.load_state_dict(data["trainer"])
            if own is not None:
                with within(f"ranks[{distributed.rank()}]."):
                    trainer.load_local_state_dict(own)
        except (ValueError, RuntimeError, KeyError) as err:
            changed = config_diff(data["config"].get("env", {}), self.config.get("env", {}), "env")
            advice = (
                f"settings that changed: {'; '.join(changed)}; resume with the checkpoint's settings"
                if changed
                else "no env setting changed: the file was edited, or written by another machina version"
            )
            raise ConfigError(f"{where} does not fit this run ({one_line(err)}); {advice}") from None
        if own is not None:
            restore_rng(own["rng"])
        if len(ranks) != distributed.world_size():
            log.warning(
                "%s was written by %d ranks and this run has %d: ranks without a saved state start with fresh envs",
                where,
                len(ranks),
                distributed.world_size(),
            )
        for change in config_diff(data["config"], self.config, ""):
            log.warning("resuming %s with a changed setting: %s", source.name, change)

    def after_stop(self) -> str:
        """What a stop leaves, in words for its message: the checkpoint a start with the same run folder continues
        from, or that there is none and such a start begins the run anew (its rows are moved aside then)."""
        again = "a start with the same run folder (hydra.run.dir)"
        if self.latest:
            return f"the last good checkpoint {str(self.latest)!r} is kept: {again} resumes from it"
        return f"no checkpoint was written: {again} starts the run anew"


def load_checkpoint(path: str | Path, trusted: Trusted | None = None) -> dict[str, Any]:
    """Read a training checkpoint safely, a ``machina.checkpoint/2`` one laid out as this format's; a policy file or
    a foreign file is refused with a clear message, and so is a policy naming a class the ``trusted`` configuration
    does not name (None: ``machina.files.trusted.in_force``)."""
    data = read_checkpoint_file(path)
    if data["format"] not in (FORMAT, FORMAT_2) and str(data["format"]).startswith("machina.checkpoint/"):
        raise ConfigError(
            f"{str(path)!r} is a training checkpoint of another machina version ({data['format']!r}, this one reads "
            f"{FORMAT!r} and {FORMAT_2!r}); start a new run, or take its policy_*.pt as a teacher or for eval.py"
        )
    if data["format"] not in (FORMAT, FORMAT_2):
        raise ConfigError(
            f"{str(path)!r} has format {data['format']!r}, not a training checkpoint ({FORMAT!r}); resume from a "
            "checkpoint_*.pt or a run folder (policy_*.pt files are for teachers and evaluation)"
        )
    check_policy_data(data.get("policy"), path, trusted)
    if data["format"] == FORMAT_2:
        data = checkpoint_schema.from_format_2(data, path)
    checkpoint_schema.check(data, path)
    return data


def write_file(path: Path, data: dict[str, Any]) -> None:
    """``torch.save`` ``data`` to ``path`` atomically. Serialised in memory first, then written by
    ``atomic_write``: a failed write (a full disk) is then the OSError of the write itself, with the OS's reason,
    not torch's "unexpected pos" from inside its zip writer."""
    buffer = io.BytesIO()
    torch.save(data, buffer)
    atomic_write(path, lambda f: f.write(buffer.getbuffer()))


def named_checkpoint(key: str, value: str) -> Path:
    """The file a setting ``key=value`` names (``resume=``, eval.py's ``checkpoint=``): a file, or the latest
    checkpoint of a run folder or of its checkpoints/ folder. A name that is neither a regular file nor a folder (a
    link loop, a device) is refused as such, not as missing."""
    path = Path(str(value)).expanduser()
    if path.is_dir():
        found = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
        if found is None:
            raise ConfigError(f"{key}={value!r}: no checkpoint_*.pt in {str(path)!r} or its checkpoints/ folder")
        return found
    if not path.is_file():
        what = "is not a regular file" if os.path.lexists(path) else "does not exist"
        raise ConfigError(f"{key}={value!r} {what}; give a checkpoint_*.pt file or a run folder")
    return path


def run_folder_of(path: Path) -> Path:
    """The run folder of a checkpoint or policy file, the way back from ``named_checkpoint``: the folder above its
    checkpoints/ folder, else its own folder (a file outside a run folder: where its run's files would be)."""
    path = Path(path)
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def latest_checkpoint(directory: Path) -> Path | None:
    found = checkpoints(directory)
    return found[-1][1] if found else None


def checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every regular file ``checkpoint_<epoch>.pt`` in ``directory``, oldest first."""
    return numbered(directory, CHECKPOINT)


def numbered(directory: Path, pattern: re.Pattern) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every regular file in ``directory`` whose name matches ``pattern`` (its group 1 the
    epoch), oldest first. Other entries with such a name (a folder, a broken or looping link) are skipped with a
    warning: they are not what their name says, and must not hide the newest one that is."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = pattern.fullmatch(path.name)
        if match and path.is_file():
            found.append((int(match.group(1)), path))
        elif match:
            log.warning("skipping %s: not a regular file", path)
    return sorted(found)


def config_diff(old: Any, new: Any, prefix: str) -> list[str]:
    """``key: old -> new`` for every leaf that differs between two nested configs (``resume`` ignored)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted((set(old) | set(new)) - {"resume"}, key=str)
        return [d for k in keys for d in config_diff(old.get(k), new.get(k), f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in config_diff(a, b, f"{prefix}[{i}]")]
    return [] if old == new else [f"{prefix}: {old!r} -> {new!r}"]
