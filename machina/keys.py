"""TensorDict keys, defined once, and ``Spec``: how a component, loss or buffer declares the keys it stores.

Shapes below use N for a flat batch of agents, B x T for a batch of BPTT segments, M for tokens per agent and A
for the number of actions. Every module reads and writes TensorDicts through these names only.
"""

import torch

# Per-step keys to store: ``{key: (shape per step, dtype)}``.
Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]

# Written by the env on reset / step (batch [N]).
# The observation, of the kind the env's ``EnvSpec.obs`` declares (``machina.env.spec``): tokens (``ObsSpec``: the
# built-in env, MettaGrid) are uint8 [N, M, 3], (packed location dy<<4|dx, feature id, value), padding tokens 0xFF;
# vectors (``VectorObsSpec``: Gymnasium) are float32 [N, size].
OBS = "env_obs"
REWARDS = "rewards"  # float32 [N]: reward of the action just taken (stored with the step that took it)
TERMINATED = "terminated"  # bool [N]: the episode ended after the action (a terminal state)
TRUNCATED = "truncated"  # bool [N]: the episode was cut after the action (time limit)
TEACHER_ACTIONS = "teacher_actions"  # int64 [N]: the scripted teacher's action for this observation
# bool [N]: the agent acts on this observation. False where a multi-agent env's agent finished before the others
# (PettingZoo) and waits for its env's episode to end: those rows are not transitions, and every loss leaves them out
# (``machina.losses.functional.live_rows``). An optional output the builder asks of every env (``ALWAYS_ASKED``);
# an env declares it in ``EnvSpec.outputs`` only if its agents can be inactive, and the rollout then stores it.
ACTIVE = "active"
ALWAYS_ASKED = frozenset({ACTIVE})
# Only from envs whose observation carries no time (``EnvSpec.observes_time`` False), only on steps where some
# episode was truncated: [N, *obs] the observation each truncated agent would have seen next (before the reset).
FINAL_OBS = "final_obs"

# Written by the trainer into each rollout step.
EPISODE_START = "episode_start"  # float32 [N]: 1 where this observation is the first of an episode
FINAL_VALUES = "final_values"  # float32 [N]: V(FINAL_OBS) where this step's action was truncated, else 0

# Policy inputs / outputs.
ACTIONS = "actions"  # int64 [N]: sampled at rollout, evaluated in training
ACT_LOG_PROB = "act_log_prob"  # float32 [N]
ENTROPY = "entropy"  # float32 [N]
FULL_LOG_PROBS = "full_log_probs"  # float32 [N, A]: only when emit_full_log_probs
LOGITS = "logits"  # float32 [N, A]
VALUES = "values"  # float32 [N]
# float32 [N, K]: the critic's values at the horizon-values loss's K other discounts (CriticHead ``horizons``)
HORIZON_VALUES = "horizon_values"
ENCODED = "encoded"  # float32 [N, H]: encoder output
CORE = "core"  # float32 [N, H]: recurrent core output
HIDDEN = "lstm_h"  # float32 [N, H]: recurrent state (h) at the start of the step / segment
CELL = "lstm_c"  # float32 [N, H]: recurrent state (c)
NEXT_HIDDEN = "next_lstm_h"  # float32 [N, H]: recurrent state after the step / segment
NEXT_CELL = "next_lstm_c"  # float32 [N, H]
QRNN_CELL = "qrnn_c"  # float32 [N, H]: the quasi-recurrent core's state at the start of the step / segment
NEXT_QRNN_CELL = "next_qrnn_c"  # float32 [N, H]: its state after the step / segment

# Training-time keys.
ADVANTAGES = "advantages"  # float32 [B, T]
PRIO_WEIGHTS = "prio_weights"  # float32 [B, T]: importance weights of prioritized sampling (ones otherwise)

# Keys of teacher losses.
TEACHER_FULL_LOG_PROBS = "teacher_full_log_probs"  # float32 [N, A]
TEACHER_VALUES = "teacher_values"  # float32 [N]
STUDENT_MASK = "student_mask"  # bool [N]
TEACHER_MASK = "teacher_mask"  # bool [N]
PPO_MASK = "ppo_mask"  # bool [N]
# bool [N]: the agent executed the teacher's action (supervisor's teacher-led steps); PPO's policy terms skip it.
TEACHER_LED = "teacher_led"

# Written back by the learner.
RATIO = "ratio"  # float32 [B, T]: pi / pi_old; V-trace reads it, refreshed from the current policy at each pass

# Where the policy writes the state that follows each state key.
NEXT_STATE = {HIDDEN: NEXT_HIDDEN, CELL: NEXT_CELL, QRNN_CELL: NEXT_QRNN_CELL}
