"""How a run presents itself to every sink (``RunInfo``): a name that says its overrides, a group (its sweep), tags
and a job type. The identity is the run's own: it comes from Hydra's record of the run and its config, and a sink
maps it to its own fields (``machina.logging.wandb_sink``: W&B's group, name, tags and job type, to which the
``wandb`` settings may add)."""

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def run_identity(cfg: DictConfig) -> dict[str, Any]:
    """``RunInfo``'s ``name``, ``group``, ``tags`` and ``job_type`` for the run of ``cfg``.

    The group is the sweep folder's name in a multirun (None for a single run). The name leads to the run's folder
    and says its overrides: ``JOB:OVERRIDES`` in a sweep (its folder is ``JOB_OVERRIDES``), ``DATE/TIME:OVERRIDES``
    for a single run (the last two parts of its folder, ``outputs/DATE/TIME`` by default), so runs with the same (or
    no) overrides still differ; without Hydra (tests) a run with no overrides has none. The tags say the enabled
    losses, the experiment, env and policy chosen, and whether the run is deterministic; the job type joins the
    enabled losses. The losses come from ``cfg.losses``: Hydra does not record a list selection in
    ``runtime.choices``.
    """
    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    overrides = hydra_cfg.job.override_dirname if hydra_cfg else ""
    sweep = hydra_cfg is not None and hydra_cfg.mode.name == "MULTIRUN"
    choices = dict(hydra_cfg.runtime.choices) if hydra_cfg else {}
    losses = [name for name, node in cfg.losses.items() if node.get("enabled", True)]
    tags = [f"loss:{name}" for name in losses]
    tags += [f"{name}:{choices[name]}" for name in ("experiment", "env", "policy") if choices.get(name)]
    tags.append(f"deterministic:{str(cfg.system.torch_deterministic).lower()}")
    if hydra_cfg is None:
        where = None
    elif sweep:
        where = str(hydra_cfg.job.num)
    else:
        where = "/".join(Path(hydra_cfg.runtime.output_dir).parts[-2:])
    return {
        "name": ":".join(part for part in (where, overrides) if part) or None,
        "group": Path(hydra_cfg.sweep.dir).name if sweep else None,
        "tags": tags,
        "job_type": "+".join(losses) or "none",
    }
