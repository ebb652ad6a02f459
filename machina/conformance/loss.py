"""``check_loss``: a loss against the ``Loss`` contract (``machina.losses.base``), in a real tiny run.

The loss is built from the composed config as ``train.py`` builds it, runs its hooks in a rollout, is called on a
minibatch of it, trains one ``debug=tiny`` epoch, and its state goes through a real checkpoint into a fresh build.
One use, in a user's own tests::

    check_loss("mine", ["hydra.searchpath=[pkg://my_lab.conf]", "losses=[ppo,mine]"])
"""

import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict

from machina.conformance.config import compose
from machina.conformance.failure import ConformanceError
from machina.errors import ConfigError, one_line
from machina.files.trusted import in_force
from machina.logging.sink import Sinks
from machina.losses.base import Loss
from machina.policy.inputs import training_input
from machina.progress import Progress
from machina.startup.build import Parts, build, build_trainer
from machina.training.checkpoint import Checkpointer, load_checkpoint

RUN_ID = "conformance"


def check_loss(name: str, overrides: Sequence[str] = ()) -> None:
    """Raise ``ConformanceError`` (one sentence: what to implement) unless the loss enabled as ``losses.<name>`` by
    ``overrides`` (composed over machina's ``conf/`` at ``debug=tiny`` sizes) meets the ``Loss`` contract::

        check_loss("mine", ["hydra.searchpath=[pkg://my_lab.conf]", "losses=[ppo,mine]"])

    Checked: it subclasses ``Loss``; it consumes only what the policy writes and declares ``experience_spec`` as
    ``{key: (shape, dtype)}``; a rollout runs its hooks; on the first minibatch of that rollout ``forward`` reads only
    stored keys (the trajectory's, the policy's and its ``experience_spec``) and what it ``consumes``, and returns at
    least one ``loss_*`` term, each a finite 0-d tensor with a gradient, and metrics that are 0-d tensors without one
    or Python floats; an epoch trains with it; its ``state_dict`` after that epoch, written by a ``Checkpointer`` and
    restored into a fresh build, is equal.
    """
    cfg = compose(overrides)
    if name not in (cfg.get("losses") or {}) or not cfg.losses[name].get("enabled", True):
        raise ConformanceError(
            f"loss {name!r} is not enabled by {list(overrides)}: select it, e.g. losses=[{name}] or "
            f"+losses.{name}._target_=module.Class"
        )
    with tempfile.TemporaryDirectory() as folder:
        try:
            parts = build(cfg)
        except ConfigError as err:
            raise ConformanceError(
                f"a run with losses.{name} is refused at start-up ({one_line(err)}): fix what the message names"
            ) from None
        with closing(parts.env):
            loss = parts.losses[name]
            check_declared(parts, loss, name)
            checkpointer = checkpointer_of(cfg, parts, Path(folder))
            checkpointer.prepare()
            trainer = build_trainer(cfg, parts, sinks=Sinks(), checkpointer=checkpointer)
            with failing(loss, "a rollout"):
                parts.policy.eval()
                parts.rollout.run(trainer.progress)
                parts.policy.train()
                parts.learner.prepare()
            check_forward(parts, loss, trainer.progress)
            with failing(loss, "an epoch of training"):
                trainer.train()
            saved = state_of(loss)
            fresh = restored(cfg, Path(folder), checkpointer.latest)
            with closing(fresh.env):
                difference = first_difference(saved, state_of(fresh.losses[name]), "")
    if difference:
        raise ConformanceError(
            f"{type(loss).__name__}'s state does not survive a checkpoint ({difference}): return all of it from "
            "state_dict (parameters, buffers, get_extra_state) and restore it in load_state_dict"
        )


@contextmanager
def failing(loss: Loss, what: str) -> Iterator[None]:
    """A failure inside the block as the sentence that names the loss and where it failed."""
    try:
        yield
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as err:
        raise ConformanceError(
            f"{type(loss).__name__} fails in {what} ({type(err).__name__}: {one_line(err)}): its hooks and forward "
            "must take what machina.losses.base.Loss documents"
        ) from None


def checkpointer_of(cfg: DictConfig, parts: Parts, folder: Path) -> Checkpointer:
    """The run's checkpointer in ``folder``, as ``machina.run`` makes it."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    return Checkpointer(folder / "checkpoints", resolved["policy"], parts.env.spec, resolved, RUN_ID)


def restored(cfg: DictConfig, folder: Path, path: Path) -> Parts:
    """A fresh build of the run with the checkpoint at ``path`` restored into it, as a resume does."""
    parts = build(cfg)
    checkpointer = checkpointer_of(cfg, parts, folder)
    trainer = build_trainer(cfg, parts, sinks=Sinks(), checkpointer=checkpointer)
    try:
        checkpointer.restore(trainer, load_checkpoint(path, in_force(cfg)), path)
    except ConfigError as err:
        parts.env.close()
        raise ConformanceError(
            f"a checkpoint of the run cannot be restored ({one_line(err)}): make load_state_dict take what "
            "state_dict returns"
        ) from None
    return parts


def check_declared(parts: Parts, loss: Loss, name: str) -> None:
    """What the builder and the buffer read before any step: the class, ``consumes``, ``experience_spec``."""
    what = type(loss).__name__
    if not isinstance(loss, Loss):
        raise ConformanceError(f"{what} (losses.{name}) is not a loss: subclass machina.losses.base.Loss")
    written = set(parts.policy.output_keys())
    for key in sorted(set(type(loss).consumes) - written):
        raise ConformanceError(
            f"{what} consumes {key!r}, which the policy never writes: list only policy outputs in consumes"
        )
    spec = loss.experience_spec(parts.env.spec)
    for key, value in spec.items():
        ok = isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], torch.dtype)
        if not ok or not all(isinstance(size, int) for size in value[0]):
            raise ConformanceError(
                f"{what} declares experience_spec[{key!r}] = {value!r}: declare each stored key as (shape per step, "
                "dtype)"
            )


def check_forward(parts: Parts, loss: Loss, progress: Progress) -> None:
    """``forward`` on the buffer's first minibatch after a rollout: what it reads and what it returns."""
    what = type(loss).__name__
    experience = parts.experience
    batch = experience.first_minibatch(parts.learner.advantage(experience))
    policy_out = parts.policy(training_input(batch.stored, batch.state))
    try:
        out = loss(batch.data, policy_out, progress)
    except KeyError as err:
        raise ConformanceError(
            f"{what} reads a key that is neither stored nor consumed ({one_line(err)}): declare what it stores in "
            "experience_spec and the policy outputs it reads in consumes"
        ) from None
    if not isinstance(out, Mapping) or not all(isinstance(key, str) for key in out):
        raise ConformanceError(f"{what}.forward returns {type(out).__name__}: return a dict of named terms and metrics")
    terms = {key: value for key, value in out.items() if key.startswith("loss_")}
    if not terms:
        raise ConformanceError(f"{what}.forward returns no loss_* term: return the terms the learner sums as loss_*")
    for key, value in terms.items():
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ConformanceError(
                f"{what}.forward returns {key} of shape {shape}, but the learner sums scalars: reduce it to a 0-d "
                "tensor (a mean over the minibatch)"
            )
        if not value.requires_grad:
            raise ConformanceError(
                f"{what}.forward returns {key} without a gradient: compute it from policy_out, not detached values"
            )
        if not torch.isfinite(value):
            raise ConformanceError(
                f"{what}.forward returns {key} = {value.item()} on a real minibatch: keep every term finite (guard "
                "divisions and logarithms)"
            )
    for key, value in out.items():
        if key in terms:
            continue
        if isinstance(value, float | int) and not isinstance(value, bool):
            continue
        if not isinstance(value, torch.Tensor) or value.dim() != 0 or value.requires_grad:
            raise ConformanceError(
                f"{what}.forward returns the metric {key} as {describe(value)}: return a detached 0-d tensor, or a "
                "Python float for a value known on the host"
            )
    sum(terms.values()).backward()
    if not any(p.grad is not None for p in parts.policy.parameters()):
        raise ConformanceError(f"{what}'s loss_* terms give the policy no gradient: compute them from policy_out")
    parts.policy.zero_grad(set_to_none=True)


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}" + (" with a gradient" if value.requires_grad else "")
    return f"a {type(value).__name__}"


def state_of(loss: Loss) -> dict[str, Any]:
    """A copy of the loss's ``state_dict`` (parameters, buffers and ``get_extra_state``)."""
    return {key: copied(value) for key, value in loss.state_dict().items()}


def copied(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, TensorDict):
        return copied(value.to_dict())
    if isinstance(value, Mapping):
        return {key: copied(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [copied(item) for item in value]
    return value


def first_difference(saved: Any, restored: Any, path: str) -> str | None:
    """Where two states first differ (``state_dict[_extra_state][count]: 3 then 0``), or None when they are equal."""
    where = f"state_dict{path}"
    if isinstance(saved, Mapping) and isinstance(restored, Mapping):
        for key in sorted(set(saved) | set(restored), key=str):
            if key not in saved or key not in restored:
                return f"{where}[{key!r}] is {'missing after restore' if key in saved else 'new after restore'}"
            found = first_difference(saved[key], restored[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(saved, torch.Tensor) and isinstance(restored, torch.Tensor):
        same = saved.shape == restored.shape and saved.dtype == restored.dtype and torch.equal(saved, restored)
        return None if same else f"{where} differs after restore"
    if isinstance(saved, list) and isinstance(restored, list) and len(saved) == len(restored):
        for i, (a, b) in enumerate(zip(saved, restored, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if saved == restored else f"{where} is {saved!r:.60} when saved and {restored!r:.60} after restore"
