"""benchmarks/carry.py: the share of heart-carrying moves that bring an agent closer to the chest, which tells a policy
that carries its hearts from one that moves at random while it holds them (docs/explanation/lab_notebook.md)."""

import importlib.util
from pathlib import Path

import torch

from machina import keys
from machina.env.machina_1 import Machina1Env
from machina.env.machina_1.grid import CHEST, HEART
from tests.commands import run_script
from tests.test_checkpoint import random_policy_file

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "carry.py"
spec = importlib.util.spec_from_file_location("carry", SCRIPT)
carry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(carry)


def env() -> Machina1Env:
    return Machina1Env(num_envs=48, seed=7, stagger=False, outputs=frozenset({keys.TEACHER_ACTIONS}))


def test_the_teacher_heads_for_the_chest_and_a_random_carrier_does_not():
    """The teacher's rule is 'holding a heart -> walk to the chest': most of its moves then shorten the distance. The
    same teacher with uniform random moves (actions 1-4) whenever it holds a heart gathers and crafts as it does, but
    carries at random: at most half of a random move's directions shorten a Manhattan distance (two of four when the
    chest is off both axes, one when it is on one)."""
    teacher_env = env()
    heading = carry.carry_stats(teacher_env, lambda step: step[keys.TEACHER_ACTIONS], 150)
    generator = torch.Generator().manual_seed(0)
    random_env = env()

    def random_carrier(step):
        holding = random_env.state["inv"][..., HEART].flatten() >= 1
        moves = torch.randint(1, 5, holding.shape, generator=generator)
        return torch.where(holding, moves, step[keys.TEACHER_ACTIONS])

    wandering = carry.carry_stats(random_env, random_carrier, 150)
    assert heading["holding"] > 0.05 and wandering["holding"] > 0.05, (heading, wandering)
    assert min(heading["moves_in_view"], wandering["moves_in_view"], wandering["moves_out_of_view"]) > 1000
    assert heading["moves_out_of_view"] > 200
    # Out of view the teacher walks its shortest path; in view it also steps round the agents crowding the chest.
    assert heading["closer_out_of_view"] > 0.65 and wandering["closer_out_of_view"] < 0.56, (heading, wandering)
    assert heading["closer_in_view"] > wandering["closer_in_view"] + 0.05, (heading, wandering)
    assert wandering["closer_in_view"] < 0.52, wandering
    # Beside the chest the teacher always moves into it (unless a lower agent slot takes the cell first); a random
    # move is the chest's direction one time in four.
    assert heading["deposits_beside"] > 0.9 and wandering["deposits_beside"] < 0.45, (heading, wandering)
    assert 0 < heading["chest_in_view"] <= 1
    # Every heart made is deposited or still held: made = deposited + held. The teacher deposits most of what it
    # makes; the random carrier, making hearts the same way, keeps more of them when the episode is cut.
    for stats in (heading, wandering):
        made, deposited, held = (stats[k] for k in ("hearts_made_per_env", "deposited_per_env", "held_at_end_per_env"))
        assert made > 0.5 and abs(made - deposited - held) < 1e-9, stats
    assert heading["held_at_end_per_env"] < 0.5 * heading["hearts_made_per_env"], heading
    assert wandering["held_at_end_per_env"] > heading["held_at_end_per_env"], (heading, wandering)
    # Of the hearts held when a tenth of the episode starts, the teacher deposits many within it (it walks each heart
    # to the chest); the random carrier, only those it bumps the chest with.
    assert heading["deposited_of_held_mid"] > 0.3 and wandering["deposited_of_held_mid"] < 0.15, (heading, wandering)
    assert heading["deposited_of_held_end"] > 2 * wandering["deposited_of_held_end"], (heading, wandering)


def test_a_policy_blind_to_its_hearts_moves_into_the_chest_as_often_without_one():
    """The teacher moves into the chest when it holds a heart and never without one (it walks round it). An actor
    that plays the teacher's moves except beside the chest, where it moves at random whether or not it holds a heart,
    moves into the chest a quarter of the time either way: the two shares tell the rule "bump the chest" from "bump the
    chest when holding a heart"."""
    teacher = carry.carry_stats(env(), lambda step: step[keys.TEACHER_ACTIONS], 150)
    assert teacher["into_chest_holding"] > 0.9 and teacher["into_chest_empty"] < 0.02, teacher
    generator = torch.Generator().manual_seed(1)
    blind_env = env()
    side = blind_env.geom.pcols

    def blind(step):
        state = blind_env.state
        chest = (state["grid"] == CHEST).long().argmax(1, keepdim=True)
        dist = (state["pos"] // side - chest // side).abs() + (state["pos"] % side - chest % side).abs()
        moves = torch.randint(1, 5, step.batch_size, generator=generator)
        return torch.where(dist.flatten() == 1, moves, step[keys.TEACHER_ACTIONS])

    blind_stats = carry.carry_stats(blind_env, blind, 150)
    for name in ("into_chest_holding", "into_chest_empty"):
        assert 0.15 < blind_stats[name] < 0.35, blind_stats
    assert abs(blind_stats["into_chest_holding"] - blind_stats["into_chest_empty"]) < 0.1, blind_stats


def test_the_command_needs_a_policy_or_the_teacher(tmp_path):
    result = run_script("benchmarks/carry.py")
    assert result.returncode == 2
    assert "give a policy file, or --teacher" in result.stderr
    missing = tmp_path / "nope.pt"
    result = run_script("benchmarks/carry.py", str(missing))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(missing) in result.stderr
    result = run_script("benchmarks/carry.py", "--teacher", "--envs", "0")
    assert result.returncode == 2 and "Traceback" not in result.stderr and "num_envs=0" in result.stderr


def test_the_command_measures_a_policy_file_and_refuses_one_of_another_env(tmp_path):
    """A policy file of the default env runs and prints every share; one built for other observations (a token limit
    of 64) is refused in one line, before any episode is played."""
    own = random_policy_file(tmp_path / "policy.pt")
    result = run_script("benchmarks/carry.py", str(own), "--envs", "4")
    assert result.returncode == 0, result.stderr
    printed = dict(line.split() for line in result.stdout.splitlines())
    assert set(printed) == {
        "holding",
        "chest_in_view",
        "closer_in_view",
        "closer_out_of_view",
        "deposits_beside",
        "moves_in_view",
        "moves_out_of_view",
        "hearts_made_per_env",
        "deposited_per_env",
        "held_at_end_per_env",
        "deposited_of_held_mid",
        "deposited_of_held_end",
        "into_chest_holding",
        "into_chest_empty",
    }, printed
    counts = ("moves_", "per_env", "of_held")  # the deposits of a tenth can outnumber the hearts held at its start
    shares = {name: value for name, value in printed.items() if not any(part in name for part in counts)}
    assert len(shares) == 7 and all(0 <= float(value) <= 1 for value in shares.values())
    assert all(float(printed[name]) >= 0 for name in ("deposited_of_held_mid", "deposited_of_held_end"))
    other = random_policy_file(tmp_path / "other.pt", ["env.max_tokens=64"])
    result = run_script("benchmarks/carry.py", str(other))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "not the default machina_1 env's" in result.stderr
