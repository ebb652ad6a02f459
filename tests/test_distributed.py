"""Data-parallel training: torchrun with 2 CPU ranks (gloo) end to end and on resume, a failing rank, and one DDP
step over 2 ranks against one process on the union of their minibatches."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

from machina import keys
from machina.errors import TrainingStopped
from machina.losses.base import Loss
from machina.policy.io import load_policy
from machina.run_folder.run_lock import RunLock
from machina.startup.build import build, build_trainer
from machina.training import distributed
from machina.training.checkpoint import load_checkpoint
from tests.conftest import ROOT, compose_config
from tests.wandb_reader import find_runs, read_run

PER_RANK = 1024  # agent steps per rank per epoch (debug=tiny): 16 envs x 4 agents x 16 steps
TINY = ["debug=tiny", "trainer.checkpoint_interval=1"]


class FailOnRank(Loss):
    """Test-only loss: raises on rank ``rank`` at its first minibatch."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def forward(self, minibatch, policy_out, progress):
        if distributed.rank() == self.rank:
            raise RuntimeError(f"rank {self.rank} fails on purpose")
        return {}


def torchrun(run_dir, *overrides, timeout=240) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=2 train.py`` on CPU, on a free port."""
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    return subprocess.run(
        [*args, str(ROOT / "train.py"), *TINY, f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_two_ranks_train_one_run_in_rank_0s_folder_and_resume(tmp_path, wandb_dirs):
    """With the default folder outputs/<date>/<time> (to the microsecond), ranks resolve different folders; here
    each rank's folder name carries its RANK, so they always differ. Rank 0's folder is the run's, for
    training and for the resume, and the job does not hang."""
    folder = f"{tmp_path}/rank${{oc.env:RANK}}"
    run_dir = tmp_path / "rank0"
    result = torchrun(folder, f"trainer.total_timesteps={3 * 2 * PER_RANK}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "rank1").exists()  # Hydra made it for rank 1; rank 1 ran in rank 0's and removed it again
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # One row per epoch (rank 0 alone writes), agent steps summed over both ranks.
    assert [r["metric/agent_step"] for r in rows] == [2 * PER_RANK, 4 * PER_RANK, 6 * PER_RANK]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint_*.pt")) == [
        f"checkpoint_{epoch:06d}.pt" for epoch in (1, 2, 3)
    ]
    (run_file,) = find_runs(run_dir / "wandb")
    assert [h["metric/agent_step"] for h in read_run(run_file)["history"]] == [r["metric/agent_step"] for r in rows]

    # Both ranks end with the same parameters, and they are the final checkpoint's.
    log = (run_dir / "train.log").read_text()
    (digest,) = re.findall(r"policy parameters identical on all 2 ranks \(digest (\w+)\)", log)
    policy, _ = load_policy(run_dir / "checkpoints" / "policy_000003.pt")
    assert distributed.param_digest(policy) == digest
    # Rank 0 wrote rank 1's env state too; the ranks' envs differ (seeded with the rank).
    data = load_checkpoint(run_dir / "checkpoints" / "checkpoint_000003.pt")
    first, other = data["ranks"]
    assert not torch.equal(other["env"]["rng_state"], first["env"]["rng_state"])

    resumed = torchrun(folder, f"trainer.total_timesteps={4 * 2 * PER_RANK}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (tmp_path / "rank1").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["metric/epoch"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["metric/agent_step"] == 8 * PER_RANK
    log = (run_dir / "train.log").read_text()
    assert "resumed from" in log and len(re.findall("identical on all 2 ranks", log)) == 2


@pytest.mark.slow
def test_a_failing_rank_stops_the_job_promptly(tmp_path):
    start = time.perf_counter()
    result = torchrun(
        tmp_path,
        "+losses.boom._target_=tests.test_distributed.FailOnRank",
        "+losses.boom.rank=1",
        "trainer.total_timesteps=100000",
        "wandb=disabled",
    )
    assert result.returncode != 0
    # torchrun's report names the rank that failed first and its error (train.py's @record).
    root_cause = re.search(r"Root Cause.*rank\s*: 1 .*rank 1 fails on purpose", result.stderr, re.DOTALL)
    assert root_cause, result.stderr[-3000:]
    assert time.perf_counter() - start < 60


# Float32 products: the gradients of two groupings of one batch agree to float rounding, which bf16-rounded inputs
# (the main job's products) would blur where an input rounds the other way.
GRAD = [
    "experience.bptt_horizon=16",
    "learner.max_grad_norm=1e9",
    "learner.update_epochs=1",  # one pass of one minibatch: one optimizer step to compare
    "wandb=disabled",
    "system.bf16_matmuls=false",
]


def make_trainer(batch_size: int, rank: int = 0):
    """Trainer over one minibatch of ``batch_size`` agent steps: 4 agents per 64 steps, each filling one 16-step row
    (so the union of two ranks' buffers is one process's buffer with twice the agents)."""
    num_envs = batch_size // 64
    overrides = [f"env.num_envs={num_envs}", f"experience.batch_size={batch_size}"]
    cfg = compose_config([*GRAD, *overrides, f"experience.minibatch_size={batch_size}"])
    return build_trainer(cfg, build(cfg, rank), sinks=[])


def step_gradients(trainer) -> list[torch.Tensor]:
    """One learner update; the gradients the optimizer stepped with (zeros for a parameter no loss reached)."""
    recorded, step = [], trainer.learner.optimizer.step

    def record(*args, **kwargs):
        params = trainer.learner.policy.parameters()
        recorded.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params])
        return step(*args, **kwargs)

    trainer.learner.optimizer.step = record
    trainer.learner.run(trainer.progress)
    (grads,) = recorded
    return grads


def ddp_rank(rank: int, port: int, out_dir: str) -> None:
    """One of 2 gloo ranks: roll out its own envs, take one DDP step, save buffer, initial weights and gradients."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    with distributed.process_group("cpu"):
        trainer = make_trainer(256, rank)
        initial = {k: v.clone() for k, v in trainer.learner.policy.state_dict().items()}  # rank 0's, broadcast by DDP
        trainer.rollout.run(trainer.progress)
        exp = trainer.learner.experience
        saved = {"initial": initial, "buffer": exp.buffer.clone(), "row_state": exp.row_state.clone()}
        saved["last_values"] = exp.last_values.clone()
        saved["grads"] = step_gradients(trainer)
        distributed.check_in_sync(trainer.learner.policy)
        if rank == 1:
            next(trainer.learner.policy.parameters()).data.add_(1.0)
        with pytest.raises(TrainingStopped, match="parameters differ"):
            distributed.check_in_sync(trainer.learner.policy)
        torch.save(saved, f"{out_dir}/rank{rank}.pt")


@pytest.mark.slow
def test_ddp_step_equals_one_process_on_the_union_of_minibatches(tmp_path):
    mp.spawn(ddp_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert not torch.equal(ranks[0]["buffer"][keys.OBS], ranks[1]["buffer"][keys.OBS])  # each rank its own envs

    single = make_trainer(512)
    single.learner.policy.load_state_dict(ranks[0]["initial"])
    single.learner.experience.buffer.update_(torch.cat([r["buffer"] for r in ranks]))
    single.learner.experience.row_state.update_(torch.cat([r["row_state"] for r in ranks]))
    single.learner.experience.last_values.copy_(torch.cat([r["last_values"] for r in ranks]))
    expected = step_gradients(single)

    assert any(g.abs().sum() > 0 for g in expected)
    for ddp, one in zip(ranks[0]["grads"], expected, strict=True):
        torch.testing.assert_close(ddp, one, rtol=1e-4, atol=1e-6)
    for a, b in zip(ranks[0]["grads"], ranks[1]["grads"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_a_refusal_only_rank_0_sees_stops_every_rank_with_its_one_line(tmp_path):
    """Rank 0 alone takes the run folder's lock: while another process holds it, every rank stops with rank 0's
    one-line refusal (exit 2), none with a lost connection or a traceback, and the folder is left as it was."""
    run_dir = tmp_path / "run"
    with RunLock(run_dir):
        before = sorted(run_dir.iterdir())
        result = torchrun(run_dir, f"trainer.total_timesteps={2 * PER_RANK}", "wandb=disabled", timeout=300)
        assert sorted(run_dir.iterdir()) == before
    output = result.stdout + result.stderr
    assert result.returncode != 0
    refusals = [line for line in output.splitlines() if "ConfigError: the run folder" in line]
    assert len(refusals) == 2 and all("is in use by PID" in line for line in refusals), output[-3000:]
    assert "Connection closed by peer" not in output, output[-3000:]
    # torchrun's launcher prints its own report of the failed ranks (a traceback of torch/distributed/run.py, and
    # SIGTERM for a rank still exiting when the first was done): no frame of machina's, and the first rank to stop
    # exited with 2, the exit code of a refusal.
    assert not re.search(r'File ".*(/machina/|train\.py)', output), output[-3000:]
    assert "exitcode  : 2 " in output.split("Root Cause")[1], output[-3000:]
