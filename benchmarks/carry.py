"""Does a policy carry its hearts to the chest? A measurement on machina_1's default map
(docs/explanation/lab_notebook.md).

    python benchmarks/carry.py runs/main_s1/checkpoints/policy_000600.pt   # a policy file or a training checkpoint
    python benchmarks/carry.py --teacher                                     # the env's scripted teacher

Plays one episode (200 steps) on each of ``--envs`` fresh layouts of the default env, with sampled actions, and
counts the agent-steps in which an agent holds at least one heart. Of those: the share with the chest inside the
agent's 11x11 window, and, among the moves (steps that change the agent's cell), the share that bring it closer to the
chest (Manhattan distance), with the chest in view and out of view, and the share of the steps beside the chest that
deposit. A policy that moves with no regard to the chest scores about 0.5 on the moves, and beside the chest a
quarter of the share of steps in which it moves; one that heads for it, more (the teacher, which heads for it but
steps round obstacles and other agents: about 0.6-0.7 on the moves, 1.0 beside the chest). Last, per env: the
hearts made, those deposited, and those still held when the episode ends, which are worth nothing (the teacher holds
the few it made in its last steps; a policy that carries at chance, most of what it made late). And whether the
policy hurries at the deadline: the hearts deposited in the episode's last tenth of steps per heart held when it
starts (``deposited_of_held_end``), against the same over the tenth after its middle (``deposited_of_held_mid``). A
policy that knows that held hearts are lost at the end deposits a larger share at the end; one that deposits when it
happens to pass the chest, the same share in both. Last, whether its use of the chest depends on its hearts: of the
steps beside the chest with no heart, the share whose action is the move into it (``into_chest_empty``), against the
same share with a heart (``into_chest_holding``). Such a move does nothing without a heart: the teacher makes it only
with one, a policy that has learned "bump the chest" but not "when I hold a heart" about as often either way.
"""

import argparse

import torch

from machina import keys
from machina.env.machina_1 import Machina1Env
from machina.env.machina_1.grid import CHEST, HEART, RADIUS
from machina.errors import ConfigError
from machina.evaluation.actors import Actor, PolicyActor, teacher_actor
from machina.evaluation.episodes import play
from machina.policy.io import load_policy


def carry_stats(env: Machina1Env, actor: Actor, steps: int) -> dict[str, float]:
    """Play ``steps`` steps of ``env`` with ``actor`` from a reset and return the shares and counts described above
    (``held_at_end_per_env``: the hearts held after the last step played, the episode's end in the command)."""
    names = ("steps", "holding", "in_view", "moves_in_view", "closer_in_view", "moves_out", "closer_out", "beside")
    sums = dict.fromkeys((*names, "deposited_beside", "made", "beside_empty", "into_holding", "into_empty"), 0)
    side = env.geom.pcols  # a cell of the padded board is row * side + col
    before = None
    held, deposits = [], []  # per step played: hearts held at its start, hearts deposited by its action
    acted = []

    def recorded(step):
        actions = actor(step)
        acted.append(actions)
        return actions

    for t, _ in enumerate(play(env, recorded)):
        state = env.state
        chest = (state["grid"] == CHEST).long().argmax(1, keepdim=True)  # [E, 1]: one chest per map
        pos = state["pos"]  # [E, A]
        dy, dx = (pos // side - chest // side).abs(), (pos % side - chest % side).abs()
        now = {
            "pos": pos.flatten().clone(),
            "dist": (dy + dx).flatten(),
            "view": ((dy <= RADIUS) & (dx <= RADIUS)).flatten(),
            "hearts": state["inv"][..., HEART].flatten().clone(),
            "chest": chest.expand_as(pos).flatten(),
        }
        now["hold"] = now["hearts"] >= 1
        if before is not None:
            change = now["hearts"] - before["hearts"]
            sums["made"] += int(change.clamp(min=0).sum())
            deposits.append(-int(change.clamp(max=0).sum()))
            moved = before["hold"] & (now["pos"] != before["pos"])
            closer = moved & (now["dist"] < before["dist"])
            for where, mask in (("in_view", before["view"]), ("out", ~before["view"])):
                sums[f"moves_{where}"] += int((moved & mask).sum())
                sums[f"closer_{where}"] += int((closer & mask).sum())
            beside = before["hold"] & (before["dist"] == 1)
            beside_empty = ~before["hold"] & (before["dist"] == 1)
            sums["beside"] += int(beside.sum())
            sums["beside_empty"] += int(beside_empty.sum())
            into = before["pos"] + env.action_delta[acted[-1]] == before["chest"]  # the env's cell change per action
            sums["into_holding"] += int((beside & into).sum())
            sums["into_empty"] += int((beside_empty & into).sum())
            sums["deposited_beside"] += int((beside & (now["hearts"] < before["hearts"])).sum())
        if t == steps:
            break
        sums["steps"] += now["hold"].numel()
        sums["holding"] += int(now["hold"].sum())
        sums["in_view"] += int((now["hold"] & now["view"]).sum())
        held.append(int(now["hearts"].sum()))
        before = now
    tenth = max(steps // 10, 1)
    return {
        "holding": sums["holding"] / sums["steps"],
        "chest_in_view": sums["in_view"] / max(sums["holding"], 1),
        "closer_in_view": sums["closer_in_view"] / max(sums["moves_in_view"], 1),
        "closer_out_of_view": sums["closer_out"] / max(sums["moves_out"], 1),
        "deposits_beside": sums["deposited_beside"] / max(sums["beside"], 1),
        "moves_in_view": sums["moves_in_view"],
        "moves_out_of_view": sums["moves_out"],
        "hearts_made_per_env": sums["made"] / env.num_envs,
        "deposited_per_env": sum(deposits) / env.num_envs,
        "held_at_end_per_env": int(now["hearts"].sum()) / env.num_envs,
        "deposited_of_held_mid": sum(deposits[steps // 2 : steps // 2 + tenth]) / max(held[steps // 2], 1),
        "deposited_of_held_end": sum(deposits[steps - tenth :]) / max(held[steps - tenth], 1),
        "into_chest_holding": sums["into_holding"] / max(sums["beside"], 1),
        "into_chest_empty": sums["into_empty"] / max(sums["beside_empty"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy", nargs="?", help="a policy file or training checkpoint (omit with --teacher)")
    parser.add_argument("--teacher", action="store_true", help="measure the env's scripted teacher instead")
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--seed", type=int, default=12345, help="the layouts' seed (training draws from others)")
    args = parser.parse_args()
    if args.teacher == bool(args.policy):
        parser.error("give a policy file, or --teacher")
    torch.manual_seed(0)  # the policy's sampled actions
    try:
        env = Machina1Env(num_envs=args.envs, seed=args.seed, stagger=False, outputs=frozenset({keys.TEACHER_ACTIONS}))
    except ConfigError as err:
        parser.error(f"--envs / --seed: {err}")
    if args.teacher:
        actor = teacher_actor
    else:
        try:
            policy, obs_spec = load_policy(args.policy)
        except ConfigError as err:
            parser.error(str(err))
        if obs_spec != env.spec.obs:
            parser.error(f"{args.policy} was trained on observations {obs_spec}, not the default machina_1 env's")
        actor = PolicyActor(policy.eval(), env.spec.num_agents, greedy=False)
    with torch.no_grad():
        stats = carry_stats(env, actor, env.max_steps - 1)
    for name, value in stats.items():
        print(f"{name:20s} {value:.3f}" if isinstance(value, float) else f"{name:20s} {value}")


if __name__ == "__main__":
    main()
