"""Checkpoints: the whole training state at an epoch boundary, written atomically, loaded without running code.

Layout of ``<run_dir>/checkpoints/`` (epochs zero-padded to 6 digits, so names sort by epoch):
    checkpoint_<epoch>.pt   the training state; the last ``trainer.keep_checkpoints`` are kept
    policy_<epoch>.pt       the policy file of that epoch (``machina.policy.io``), all kept: teachers
                            (``losses.eer_kickstarter.teacher.path``) and evaluation read them
A checkpoint is a dict of plain data and tensors, so ``torch.load(weights_only=True)`` reads it:
    format              "machina.checkpoint/2"
    policy              a policy file's payload (architecture + weights)
    trainer             Trainer.state_dict(): epoch and agent_step after the epoch's update, the per-epoch history
                        (agent_step / reward / SPS, so the run summary spans resumes) and the learner's optimizer
    ranks               per rank, Trainer.local_state_dict() (env, rollout, losses) and its RNG states (torch,
                        CUDA, numpy, python), gathered by rank 0, which alone writes
    wandb_run_id        the W&B run a resume continues (None when W&B was off)
    config              the resolved config of the run that wrote it
    checksum            sha256 of everything above (``machina.checksum``), verified on load
Checkpoints are written only with finite parameters and optimizer state. Schedules are pure functions of agent_step,
so the counters restore them. The experience buffer is not saved: at an epoch boundary every row of it is rewritten
before it is read again.
"""

import logging
import re
from pathlib import Path
from typing import Any

import torch

from machina import checksum, distributed
from machina.env.spec import ObsSpec
from machina.errors import ConfigError, TrainingStopped
from machina.files import atomic_write
from machina.policy.io import check_policy_data, policy_payload, read_checkpoint_file
from machina.training.state import capture_rng, nonfinite, restore_rng

log = logging.getLogger(__name__)

FORMAT = "machina.checkpoint/2"
CHECKPOINT = re.compile(r"checkpoint_(\d+)\.pt")
POLICY = re.compile(r"policy_(\d+)\.pt")


class Checkpointer:
    """Writes checkpoints of a trainer into ``directory`` and restores a trainer from one.

    Args:
        directory: ``<run_dir>/checkpoints``; created, and checked to be writable, by ``prepare``.
        architecture: the resolved ``policy`` config, enough to rebuild the policy.
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
        ``keep`` checkpoints. Non-finite parameters or optimizer state, or a failed write (full disk, folder no
        longer writable), stop training naming the epoch or the file; the previous checkpoint stays the newest.
        Under torchrun every rank calls this at the same epoch and rank 0 writes every rank's state."""
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
        ranks = distributed.gather_to_main({**trainer.local_state_dict(), "rng": capture_rng()})
        if ranks is None:  # not rank 0
            self.latest = path
            return path
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
            atomic_write(self.directory / f"policy_{name}", lambda f: torch.save(payload, f))
            atomic_write(path, lambda f: torch.save(checksum.seal(state), f))
        # torch.save reports a failed write (a full disk) as a RuntimeError, the temp file's open as an OSError.
        except (OSError, RuntimeError) as err:
            reason = " ".join(str(getattr(err, "strerror", None) or err).split())[:300]
            raise TrainingStopped(
                f"cannot write checkpoint {str(path)!r} ({reason}); free disk space or make the folder writable, "
                f"then rerun the same command to resume ({self._kept()})"
            ) from None
        self.latest = path
        found = checkpoints(self.directory)
        # Newer epochs belong to a future abandoned by resuming from an older checkpoint: a later resume must not
        # pick them up.
        for epoch, old in found:
            if epoch > trainer.epoch:
                old.unlink()
        for old in [p for e, p in found if e <= trainer.epoch][:-keep]:
            old.unlink()
        log.info("checkpoint %s (epoch %d, agent step %d)", path, trainer.epoch, trainer.agent_step)
        return path

    def restore(self, trainer, data: dict[str, Any], source: Path) -> None:
        """Load ``data`` (read from ``source`` by ``load_checkpoint``) into ``trainer``; refuse a checkpoint it
        cannot continue, naming the settings that differ (a resume may be automatic: say which file it was).

        The optimizer's state (moment estimates, step counts) comes from the checkpoint; its hyper-parameters (lr,
        eps, betas, weight decay: every param_group entry but ``params``) are this run's, so a changed
        ``optimizer.lr`` takes effect. ``policy.action_probs.emit_full_log_probs`` is not architecture (it follows
        the enabled losses), so the set of losses may change on resume."""
        policy, where = data["policy"], f"the checkpoint {str(source)!r}"
        if architecture_only(policy["architecture"]) != architecture_only(self.architecture):
            raise ConfigError(
                f"{where} was trained with another policy architecture ("
                + "; ".join(config_diff(policy["architecture"], self.architecture, "policy"))
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
            trainer.load_state_dict(data["trainer"])
            if own is not None:
                trainer.load_local_state_dict(own)
        except (ValueError, RuntimeError, KeyError) as err:
            changed = config_diff(data["config"].get("env", {}), self.config.get("env", {}), "env")
            raise ConfigError(
                f"{where} does not fit this run ({str(err)[:200]}); settings that changed: "
                f"{'; '.join(changed) or 'none in env'}; resume with the checkpoint's settings"
            ) from None
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


def architecture_only(architecture: dict[str, Any]) -> dict[str, Any]:
    """A policy config without its run-time flag ``action_probs.emit_full_log_probs`` (derived from the losses)."""
    probs = architecture.get("action_probs")
    if not isinstance(probs, dict):
        return architecture
    return {**architecture, "action_probs": {k: v for k, v in probs.items() if k != "emit_full_log_probs"}}


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a training checkpoint safely; a policy file or a foreign file is refused with a clear message."""
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
    check_policy_data(data.get("policy"), path)
    return data


def find_checkpoint(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: ``resume`` (a checkpoint file, a run folder or its checkpoints folder), or,
    when ``resume`` is null, the latest checkpoint in ``run_dir`` if it has one (a rerun of the same command)."""
    if resume is None:
        return latest_checkpoint(Path(run_dir) / "checkpoints")
    path = Path(str(resume)).expanduser()
    if path.is_file():
        return path
    if not path.is_dir():
        raise ConfigError(f"resume={resume!r} does not exist; give a checkpoint_*.pt file or a run folder")
    found = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
    if found is None:
        raise ConfigError(f"resume={resume!r}: no checkpoint_*.pt in {str(path)!r} or its checkpoints/ folder")
    return found


def latest_checkpoint(directory: Path) -> Path | None:
    found = checkpoints(directory)
    return found[-1][1] if found else None


def checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every ``checkpoint_<epoch>.pt`` in ``directory``, oldest first."""
    directory = Path(directory)
    found = (CHECKPOINT.fullmatch(p.name) for p in directory.glob("checkpoint_*.pt"))
    return sorted((int(m.group(1)), directory / m.group(0)) for m in found if m)


def config_diff(old: Any, new: Any, prefix: str) -> list[str]:
    """``key: old -> new`` for every leaf that differs between two nested configs (``resume`` ignored)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted((set(old) | set(new)) - {"resume"}, key=str)
        return [d for k in keys for d in config_diff(old.get(k), new.get(k), f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in config_diff(a, b, f"{prefix}[{i}]")]
    return [] if old == new else [f"{prefix}: {old!r} -> {new!r}"]


def check_same_run(source: Path, run_dir: Path) -> None:
    """Refuse to continue another folder's checkpoint (``resume=``) in a run folder that already holds a run's
    history (metrics rows or checkpoints): the resume would drop that history and mix the two runs' files. Into a
    fresh folder it is allowed."""
    own = (Path(run_dir) / "checkpoints").resolve()
    if Path(source).resolve().parent == own:
        return
    metrics = Path(run_dir) / "metrics.jsonl"
    history = [p.name for p in sorted(own.glob("*_*.pt")) if CHECKPOINT.fullmatch(p.name) or POLICY.fullmatch(p.name)]
    if metrics.is_file() and metrics.read_text(encoding="utf-8").strip():
        history.insert(0, "metrics.jsonl")
    if history:
        raise ConfigError(
            f"resume={str(source)!r} is another run's checkpoint and the run folder {str(run_dir)!r} already holds a "
            f"run's history ({', '.join(history[:3])}{', ...' if len(history) > 3 else ''}); continuing there would "
            "mix the two runs: continue into a new folder (hydra.run.dir=NEW_FOLDER), or drop resume= to continue "
            "this folder's own run"
        )
