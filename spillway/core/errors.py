"""The two kinds of error every spillway command turns into an exit code and one line."""


class ConfigError(Exception):
    """Bad input, usage or configuration (exit 2); the message names what and says why."""


class Failed(Exception):
    """The operation was refused or failed (exit 1); the message says why."""


class JobNotFound(Failed):
    """The server knows no job of that id (exit 1)."""
