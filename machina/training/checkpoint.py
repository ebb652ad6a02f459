"""Checkpoints: the whole training state at an epoch boundary, written atomically, loaded without running code.

Layout of ``<run_dir>/checkpoints/`` (epochs zero-padded to 6 digits, so names sort by epoch):
    checkpoint_<epoch>.pt   the training state; the last ``trainer.keep_checkpoints`` are kept
    policy_<epoch>.pt       the policy file of that epoch (``machina.policy.io``), all kept: teachers
                            (``losses.eer_kickstarter.teacher.path``) and evaluation read them
A checkpoint is a dict of plain data and tensors, so ``torch.load(weights_only=True)`` reads it:
    format              "machina.checkpoint/2"
    policy              a policy file's payload (architecture + weights): the policy the run produces, the same as
                        policy_<epoch>.pt (with learner.average_horizon, the average of the weights)
    trainer             Trainer.state_dict(): epoch and agent_step after the epoch's update, the per-epoch history
                        (agent_step / reward / SPS, so the run summary spans resumes) and the learner's optimizer
                        (and, with a weight average, the policy's own training weights and the average's count)
    ranks               per rank, Trainer.local_state_dict() (env, rollout, losses) and its RNG states (torch,
                        CUDA, numpy, python), gathered by rank 0, which alone writes
    wandb_run_id        the W&B run a resume continues (None when W&B was off)
    config              the resolved config of the run that wrote it
    checksum            sha256 of everything above (``machina.files.checksum``), verified on load
A checkpoint is written only when it is good to resume from: finite parameters and optimizer state, and finite losses
with its weights (``Learner.loss_check``); so the checkpoint a stopped run names as its last good one is one whose
weights evaluate to finite losses. Files are serialised in memory and then written atomically
(``machina.files.atomic``), so
a failed write reports the OS's reason (a full disk) and leaves the previous checkpoint the newest. History is
append-only: a save prunes only checkpoints older than ``trainer.keep_checkpoints`` (``machina.run_folder.history``
moves an
abandoned future aside before a rewound run continues).

Loading trusts nothing in the file: it is read as bounded plain data (``machina.files.torch_file``), its checksum must
match, its structure and types must be a checkpoint's (``checkpoint_schema``), and each part checks the state it
restores (``Checkpointer.restore``); every refusal is a ConfigError before the run folder changes. Schedules are pure
functions of agent_step, so the counters restore them. The experience buffer is not saved: at an epoch boundary every
row of it is rewritten before it is read again.
"""

import io
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import torch

from machina.env.spec import ObsSpec
from machina.errors import ConfigError, TrainingStopped, one_line
from machina.files import checksum
from machina.files.atomic import atomic_write
from machina.files.saved_state import within
from machina.files.snapshot import capture_rng, nonfinite, restore_rng
from machina.files.trusted import Trusted
from machina.policy.allowlist import architecture
from machina.policy.io import check_policy_data, policy_payload, read_checkpoint_file
from machina.training import checkpoint_schema, distributed

log = logging.getLogger(__name__)

FORMAT = "machina.checkpoint/2"
CHECKPOINT = re.compile(r"checkpoint_(\d+)\.pt")


class Checkpointer:
    """Writes checkpoints of a trainer into ``directory`` and restores a trainer from one.

    Args:
        directory: ``<run_dir>/checkpoints``; created, and checked to be writable, by ``prepare``.
        architecture: the resolved ``policy`` config, enough to rebuild the policy (stored without its run-time
            flag ``action_probs.emit_full_log_probs``: ``machina.policy.allowlist.architecture``).
        obs_spec: the env's observation spec, stored with the policy.
        config: the resolved run config, stored for the record and compared on resume.
        wandb_run_id: the W&B run this run logs to.
    """

    def __init__(
        self,
        directory: Path,
        architecture: dict[str, Any],
        obs_spec: ObsSpec,
        config: dict[str, Any],
        wandb_run_id: str | None,
    ):
        self.directory = Path(directory)
        self.architecture, self.obs_spec, self.config = architecture, obs_spec, config
        self.wandb_run_id = wandb_run_id
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

    def save(self, trainer, keep: int) -> Path:
        """Write ``policy_<epoch>.pt`` then ``checkpoint_<epoch>.pt`` (the commit point), and keep the last
        ``keep`` checkpoints. Non-finite parameters or optimizer state, weights whose losses are not finite, or a
        failed write (full disk, folder no longer writable) stop training naming the epoch or the file; the previous
        checkpoint stays the newest. Under torchrun every rank calls this at the same epoch and rank 0 writes every
        rank's state."""
        name = f"{trainer.epoch:06d}.pt"
        path = self.directory / f"checkpoint_{name}"
        # Every rank holds the same parameters and optimizer state (DDP), so every rank takes the same decision.
        bad = nonfinite({"policy": trainer.policy.state_dict(), "optimizer": trainer.optimizer.state_dict()["state"]})
        if bad:
            raise TrainingStopped(
                f"non-finite values after epoch {trainer.epoch} in {', '.join(bad[:3])}"
                + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
                + f": checkpoint {str(path)!r} is not written and {self._kept()}; lower optimizer.lr, the loss's "
                "coefficients or learner.max_grad_norm"
            )
        self._check_losses(trainer, path)
        ranks = distributed.gather_to_main({**trainer.local_state_dict(), "rng": capture_rng()})
        if ranks is None:  # not rank 0
            self.latest = path
            return path
        with trainer.learner.averaged_weights():
            payload = policy_payload(trainer.policy, self.architecture, self.obs_spec)
        state = {
            "format": FORMAT,
            "policy": payload,
            "trainer": trainer.state_dict(),
            "ranks": ranks,
            "wandb_run_id": self.wandb_run_id,
            "config": self.config,
        }
        try:
            write_file(self.directory / f"policy_{name}", payload)
            write_file(path, checksum.seal(state))
        except OSError as err:
            reason = one_line(err.strerror or err)
            raise TrainingStopped(
                f"cannot write checkpoint {str(path)!r} ({reason}); free disk space or make the folder writable, "
                f"then rerun the same command to resume ({self._kept()})"
            ) from None
        self.latest = path
        older = [p for epoch, p in checkpoints(self.directory) if epoch <= trainer.epoch]
        for old in older[:-keep]:
            old.unlink()
        log.info("checkpoint %s (epoch %d, agent step %d)", path, trainer.epoch, trainer.agent_step)
        return path

    def _check_losses(self, trainer, path: Path) -> None:
        """Refuse to call the weights good unless their losses are finite on the epoch's own data: a run that stops
        names its newest checkpoint as the one to resume from, and weights that exploded but stayed finite (|w| ~
        1e20 after a too-large learning rate) pass the parameter check and give NaN losses at the next forward. No
        bound on the weights' magnitude instead: how large is too large depends on the architecture and the data,
        while the losses are what a resume needs."""
        losses = trainer.learner.loss_check()
        bad = [f"{name}={value}" for name, value in losses.items() if not math.isfinite(value)]
        # All ranks write or none: a rank whose own rows give finite losses stops with the others.
        if distributed.agree_max(int(bool(bad))):
            raise TrainingStopped(
                f"the weights after epoch {trainer.epoch} give non-finite losses "
                f"({', '.join(bad) or 'on another rank'}): checkpoint {str(path)!r} is not written and "
                f"{self._kept()}; lower optimizer.lr, the loss's coefficients or learner.max_grad_norm"
            )

    def restore(self, trainer, data: dict[str, Any], source: Path) -> None:
        """Load ``data`` (read from ``source`` by ``load_checkpoint``) into ``trainer``; refuse a checkpoint it
        cannot continue, naming the settings that differ or the entry that is wrong (a resume may be automatic: say
        which file it was). Each part checks the state it restores (shapes, dtypes, value ranges), so every refusal
        comes here, before the run folder changes.

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
        if policy["num_actions"] != trainer.policy.num_actions:
            raise ConfigError(
                f"{where} has a policy with {policy['num_actions']} actions but the env has "
                f"{trainer.policy.num_actions}; resume with the checkpoint's env.num_vibes"
            )
        ranks = data["ranks"]
        own = ranks[distributed.rank()] if distributed.rank() < len(ranks) else None
        try:
            trainer.policy.load_state_dict(policy["state_dict"])
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

    def _kept(self) -> str:
        return f"the last good checkpoint {str(self.latest)!r} is kept" if self.latest else "no checkpoint exists"


def load_checkpoint(path: str | Path, trusted: Trusted | None = None) -> dict[str, Any]:
    """Read a training checkpoint safely; a policy file or a foreign file is refused with a clear message, and so is
    a policy naming a class the ``trusted`` configuration does not name (None: ``machina.files.trusted.in_force``)."""
    data = read_checkpoint_file(path)
    if data["format"] != FORMAT and str(data["format"]).startswith("machina.checkpoint/"):
        raise ConfigError(
            f"{str(path)!r} is a training checkpoint of another machina version ({data['format']!r}, this one reads "
            f"{FORMAT!r}); start a new run, or take its policy_*.pt as a teacher or for eval.py"
        )
    if data["format"] != FORMAT:
        raise ConfigError(
            f"{str(path)!r} has format {data['format']!r}, not a training checkpoint ({FORMAT!r}); resume from a "
            "checkpoint_*.pt or a run folder (policy_*.pt files are for teachers and evaluation)"
        )
    check_policy_data(data.get("policy"), path, trusted)
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
