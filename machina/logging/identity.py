"""How a run presents itself in W&B (and to any sink: ``RunInfo``): group (one per sweep), a name that says its
overrides, and tags."""

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def wandb_identity(cfg: DictConfig) -> dict[str, Any]:
    """Group/name/job type/tags: one group per sweep, a name that says the run's overrides.

    The group is the sweep folder's name (``wandb.group`` overrides it). The name leads to the run's folder and
    says its overrides: ``JOB:OVERRIDES`` in a sweep (its folder is ``JOB_OVERRIDES``), ``DATE/TIME:OVERRIDES`` for
    a single run (the last two parts of its folder, ``outputs/DATE/TIME`` by default), so runs with the same (or
    no) overrides still differ. Without Hydra (tests) a run with no overrides gets W&B's generated name. The losses
    come from ``cfg.losses``: Hydra does not record a list selection in ``runtime.choices``.
    """
    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    overrides = hydra_cfg.job.override_dirname if hydra_cfg else ""
    group = cfg.wandb.group
    if group is None and hydra_cfg is not None and hydra_cfg.mode.name == "MULTIRUN":
        group = Path(hydra_cfg.sweep.dir).name
    choices = dict(hydra_cfg.runtime.choices) if hydra_cfg else {}
    tags = [f"loss:{name}" for name, node in cfg.losses.items() if node.get("enabled", True)]
    tags += [f"{name}:{choices[name]}" for name in ("experiment", "env", "policy") if choices.get(name)]
    tags.append(f"deterministic:{str(cfg.system.torch_deterministic).lower()}")
    tags += list(cfg.wandb.tags)
    if hydra_cfg is None:
        where = None
    elif hydra_cfg.mode.name == "MULTIRUN":
        where = str(hydra_cfg.job.num)
    else:
        where = "/".join(Path(hydra_cfg.runtime.output_dir).parts[-2:])
    name = ":".join(part for part in (where, overrides) if part) or None
    return {
        "group": group,
        "name": name,
        "job_type": "+".join(n for n, node in cfg.losses.items() if node.get("enabled", True)) or "none",
        "tags": tags,
    }
