"""Errors that machina reports to the user as a message, not a traceback."""

MAX_REASON = 300  # characters of a quoted error kept in a one-line message


def one_line(text: object) -> str:
    """``text`` (an error's message, say) on one line: whitespace runs to one space, at most ``MAX_REASON``
    characters (pybind11 and pydantic messages span many lines)."""
    return " ".join(str(text).split())[:MAX_REASON]


class ConfigError(ValueError):
    """A setting is invalid; the message names the setting to change."""


class TrainingStopped(RuntimeError):
    """Training stopped cleanly (a NaN loss, an interrupt); the stop names the checkpoint a rerun continues from."""


class Interrupted(TrainingStopped):
    """Stopped by a signal (SIGINT, SIGTERM) after checkpointing; the process exits with 128 + ``signum``."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = int(signum)


class EnvFailed(TrainingStopped):
    """The env's engine failed (a worker process died or stopped answering): the run ends with this message after
    checkpointing the last finished epoch, so a start with the same run folder resumes."""
