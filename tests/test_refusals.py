"""Start-up refusals: a bad value stops the run before any training, with exit code 2 and one line that names the key
and the value (no traceback). One list of cases for every setting checked at start-up."""

import pytest

from tests.test_checkpoint import run_reporting

REFUSED = [
    (["learner.advantage.gamma=1.5"], "learner.advantage.gamma=1.5 must be a number in [0, 1]"),
    (["learner.advantage.gamma=-0.1"], "learner.advantage.gamma=-0.1 must be a number in [0, 1]"),
    (["learner.advantage.gamma=nan"], "learner.advantage.gamma=nan must be a number in [0, 1]"),
    (["learner.advantage.gae_lambda=2"], "learner.advantage.gae_lambda=2 must be a number in [0, 1]"),
    (["learner.advantage.gae_lambda=inf"], "learner.advantage.gae_lambda=inf must be a number in [0, 1]"),
    (["learner.advantage.gae_lambda=nan"], "learner.advantage.gae_lambda=nan must be a number in [0, 1]"),
    (["optimizer.lr=-0.001"], "optimizer.lr=-0.001 must be a finite number >= 0"),
    (["optimizer.lr=nan"], "optimizer.lr=nan must be a finite number >= 0"),
    (["optimizer.lr=inf"], "optimizer.lr=inf must be a finite number >= 0"),
    (["optimizer.eps=-1e-8"], "optimizer.eps=-1e-08 must be a finite number >= 0"),
    (["optimizer.eps=nan"], "optimizer.eps=nan must be a finite number >= 0"),
    (["losses=[]"], "losses=[] enables no loss"),
    (["learner.average_horizon=-1"], "learner.average_horizon=-1 must be an integer >= 0"),
    (["learner.average_horizon=1.5"], "learner.average_horizon=1.5 has the wrong type"),
    (["learner.update_epochs=0"], "learner.update_epochs=0 must be an integer >= 1"),
    (["learner/lr_schedule=linear", "learner.lr_schedule.floor=2"], "learner.lr_schedule.floor=2 must be a number in"),
    (["losses.ppo.ent_coef=-0.5"], "losses.ppo.ent_coef=-0.5 must be a finite number >= 0"),
    (["experience/sampler=prioritized", "experience.sampler.beta0=2"], "experience.sampler.beta0=2 must be a number"),
    (["experience.minibatch_size=100"], "experience.minibatch_size=100 must be a multiple of bptt_horizon=16"),
    (["system.threads=-1"], "system.threads=-1 must be an integer >= 0"),
    (["system.compile=yes"], "system.compile='yes' must be true, false or auto"),
    # A part's refusal names where it was configured, not where its class is usually enabled.
    (
        ["+losses.ppo2._target_=machina.losses.ppo.PPOLoss", "+losses.ppo2.clip_coef=-1"],
        "losses.ppo2.clip_coef=-1 must be a finite number >= 0",
    ),
    (
        [
            "losses=[supervisor]",
            "losses.supervisor.action_loss_coef={_target_:machina.schedules.Linear,start:1,end:0,end_step:0}",
        ],
        "losses.supervisor.action_loss_coef.end_step=0 must be above begin_step=0",
    ),
    (
        [
            "+losses.kick._target_=machina.losses.eer_kickstarter.EERKickstarterLoss",
            "+losses.kick.teacher={_target_:machina.policy.io.load_teacher,path:null}",
        ],
        "losses.kick.teacher.path=None names no teacher",
    ),
]


@pytest.mark.parametrize("overrides, expected", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_bad_values_are_refused_at_start_up(tmp_path, overrides, expected):
    code, message = run_reporting(tmp_path, *overrides, epochs=1)
    # The message begins with the setting: a path put in front twice, or in front of another node's key, shows.
    assert code == 2 and message.split(": ", 1)[1].startswith(expected) and "\n" not in message, message
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()
