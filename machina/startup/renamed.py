"""Config keys that moved, so the command lines users (and sweep presets' command lines) type keep working: the one
table of old spellings and the rewrite of command-line overrides that applies it (``preflight.check_or_exit`` calls
it before it checks anything; tests and benchmarks that compose in-process can call it on their overrides too).

    python train.py learner.gamma=0.9   -> note: learner.gamma is now learner.advantage.gamma; taking it as such
"""

import sys

# Old spelling -> new, each straight to today's key (a key that moved twice is listed once per old spelling).
RENAMED = {
    "trainer.update_epochs": "learner.update_epochs",
    "trainer.max_grad_norm": "learner.max_grad_norm",
    "trainer.gamma": "learner.advantage.gamma",
    "trainer.gae_lambda": "learner.advantage.gae_lambda",
    "trainer.vtrace_rho_clip": "learner.advantage.rho_clip",
    "trainer.vtrace_c_clip": "learner.advantage.c_clip",
    "learner.gamma": "learner.advantage.gamma",
    "learner.gae_lambda": "learner.advantage.gae_lambda",
    "learner.vtrace_rho_clip": "learner.advantage.rho_clip",
    "learner.vtrace_c_clip": "learner.advantage.c_clip",
    "learner.compact_tokens": "experience.compact_tokens",
    "trainer.evaluation": "evaluation",  # back at the top, its own group (conf/evaluation/)
    "experience.sampling": "experience/sampler",
    "experience.prio_alpha": "experience.sampler.alpha",
    "experience.prio_beta0": "experience.sampler.beta0",
    "losses.eer_kickstarter.teacher_checkpoint": "losses.eer_kickstarter.teacher.path",
}


def renamed(overrides: list[str]) -> list[str]:
    """``overrides`` (command-line arguments) with the keys of ``RENAMED``, or keys under them, in their new
    spelling, keeping any ``+``/``++``/``~`` prefix and the value; one note on stderr per rewritten override, saying
    the new spelling. Other arguments (flags, unrelated keys) pass through unchanged."""
    out = []
    for arg in overrides:
        prefix = arg[: len(arg) - len(arg.lstrip("+~"))]
        key, sep, value = arg[len(prefix) :].partition("=")
        for old, new in RENAMED.items():
            if key == old or key.startswith(old + "."):
                moved = new + key[len(old) :]
                print(f"note: {key} is now {moved}; taking it as such", file=sys.stderr)
                arg = f"{prefix}{moved}{sep}{value}"
                break
        out.append(arg)
    return out
