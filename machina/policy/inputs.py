"""Build the policy's input TensorDict (batch [B], per-step keys [B, T, ...]) from rollout steps or minibatches."""

from tensordict import TensorDict

from machina import keys


def rollout_input(step: TensorDict, state: TensorDict) -> TensorDict:
    """A rollout step (batch [N]) and recurrent state [N] -> input [N] with T = 1 (views, no copies)."""
    return TensorDict(
        {keys.OBS: step[keys.OBS].unsqueeze(1), keys.DONES: step[keys.DONES].unsqueeze(1), **state.to_dict()},
        batch_size=[step.batch_size[0]],
    )


def training_input(stored: TensorDict, state: TensorDict) -> TensorDict:
    """Stored steps [B, T] and the recurrent state at each segment's start [B] -> input [B] that evaluates the
    stored actions."""
    return TensorDict(
        {
            keys.OBS: stored[keys.OBS],
            keys.DONES: stored[keys.DONES],
            keys.ACTIONS: stored[keys.ACTIONS],
            **state.to_dict(),
        },
        batch_size=[stored.batch_size[0]],
    )


def next_state(out: TensorDict, state: TensorDict) -> TensorDict:
    """The state after the policy's step: ``NEXT_*`` outputs renamed to the state keys, batch like ``state``."""
    return TensorDict({key: out[keys.NEXT_STATE[key]] for key in state.keys()}, batch_size=state.batch_size)
