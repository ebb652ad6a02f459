"""OmegaConf resolvers, registered once before composition (``register()`` is idempotent).

``${consumes:KEY,${losses}}`` is true when an enabled loss's class lists KEY in its ``consumes`` attribute. The loss
class is the single source of truth for what it reads, so no list of loss names exists anywhere.

``policy.action_probs.emit_full_log_probs`` is derived here, and only here: conf/config.yaml sets it once, for
every policy, to ``${consumes:full_log_probs,${losses}}``, and every other part reads that one value (the policy's
``ActionProbs`` is built with it; start-up, ``machina.startup.build.check_policy_outputs``, refuses a forced false
that an enabled loss needs). It is a run-time setting, not architecture: policy files and checkpoints store the
policy config without it (``machina.policy.allowlist.architecture``), and whoever loads a policy file says whether
it emits (``machina.policy.io.load_policy``). A new loss whose class lists ``full_log_probs`` in ``consumes``
switches it on with no other edit.
"""

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf


def enabled_loss_classes(losses: DictConfig | None) -> dict[str, type]:
    """Map each enabled loss name to its class (``_target_``), in config order. A node without ``_target_`` holds
    settings of a loss the command did not select (a preset tuning it, then ``losses=[...]`` leaving it out): it is
    no loss here, and ``machina.startup.build.build_losses`` refuses it with a message that says so."""
    if losses is None:
        return {}
    return {
        name: get_class(node["_target_"])
        for name, node in losses.items()
        if "_target_" in node and node.get("enabled", True)
    }


def consumes(key: str, losses: DictConfig | None) -> bool:
    return any(key in cls.consumes for cls in enabled_loss_classes(losses).values())


def register() -> None:
    # use_cache=False: the result depends on the losses node, not on the argument string (see hydra-wandb notes).
    OmegaConf.register_new_resolver("consumes", consumes, replace=True, use_cache=False)
