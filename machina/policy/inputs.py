"""Build the policy's input TensorDict (batch [B], per-step keys [B, T, ...]) from rollout steps or minibatches."""

from tensordict import TensorDict

from machina import keys

# Per-step keys a policy may read; each is passed when present (a feed-forward policy stores no EPISODE_START).
STEP_INPUTS = (keys.OBS, keys.EPISODE_START)


def rollout_input(step: TensorDict, state: TensorDict) -> TensorDict:
    """A rollout step (batch [N]) and recurrent state [N] -> the input of ``policy.act`` (batch [N], no time axis;
    the same tensors, no copies)."""
    present = step.keys()
    return TensorDict(
        {**{key: step[key] for key in STEP_INPUTS if key in present}, **state.to_dict()},
        batch_size=[step.batch_size[0]],
    )


def training_input(stored: TensorDict, state: TensorDict) -> TensorDict:
    """Stored steps [B, T] and the recurrent state at each segment's start [B] -> input [B] that evaluates the
    stored actions."""
    present = stored.keys()
    return TensorDict(
        {**{key: stored[key] for key in (*STEP_INPUTS, keys.ACTIONS) if key in present}, **state.to_dict()},
        batch_size=[stored.batch_size[0]],
    )


def next_state(out: TensorDict, state: TensorDict) -> TensorDict:
    """The state after the policy's step: ``NEXT_*`` outputs renamed to the state keys, batch like ``state``."""
    return TensorDict({key: out[keys.NEXT_STATE[key]] for key in state.keys()}, batch_size=state.batch_size)
