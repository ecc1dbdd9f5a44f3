"""Errors that end a command with a clear message instead of a traceback."""


class MqttAuthError(RuntimeError):
    """The broker refused our credentials; reconnecting will not help."""
