"""The one exception users see: a clear, single-line message about their input."""


class LeapDecodeError(ValueError):
    """Bad input or environment, explained in one line. The CLI prints it without a traceback."""


def require(condition: bool, message: str) -> None:
    """Raise LeapDecodeError(message) unless condition holds."""
    if not condition:
        raise LeapDecodeError(message)
