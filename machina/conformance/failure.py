"""The one error the conformance kit raises: what a part lacks, in one sentence that says what to implement."""


class ConformanceError(AssertionError):
    """A part does not meet the contract the trainer relies on; the message names the part and what to implement."""
