"""What an epoch reports besides the losses: per-episode means of the env's stats, buffer statistics, and the run
summary that W&B's runs table and sweepers read."""

import math

import torch


def episode_metrics(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-episode means of the env's summed stats (NaN when no episode ended), plus the episode count."""
    episodes = stats["episodes"]
    out = {"env/episodes": episodes}
    for name, total in stats.items():
        if name != "episodes":
            out[f"env/{name}"] = torch.where(episodes > 0, total / episodes.clamp(min=1), float("nan"))
    return out


def summarize(history: list[dict[str, float]]) -> dict[str, float]:
    """Run summary for the W&B runs table and for sweepers, from the per-epoch ``history`` (which spans resumes).

    ``summary/wall_time`` is the training time: the sum of the epochs' wall times (each epoch's steps / its
    ``overview/sps``; start-up and periodic evaluation are not in it). ``summary/sps_mean`` is agent steps / that
    time, the run's throughput: not the mean of the per-epoch rates, which overstates it when epochs vary.
    Also final and best ``overview/reward`` (NaN when no episode ended), the fastest epoch and the agent steps.
    """
    rewards = [m["overview/reward"] for m in history if math.isfinite(m["overview/reward"])]
    steps = [m["metric/agent_step"] for m in history]
    before = [0, *steps][:-1]
    seconds = sum((s - b) / m["overview/sps"] for b, s, m in zip(before, steps, history, strict=True))
    return {
        "summary/final_reward": rewards[-1] if rewards else float("nan"),
        "summary/best_reward": max(rewards) if rewards else float("nan"),
        "summary/sps_mean": steps[-1] / seconds if history else 0.0,
        "summary/sps_max": max(m["overview/sps"] for m in history) if history else 0.0,
        "summary/agent_steps": steps[-1] if history else 0,
        "summary/wall_time": seconds,
    }
