"""Errors raised at start-up, shared by the config loader and the modules it draws on."""


class ConfigError(ValueError):
    """A configuration that cannot run: names the key (or file) and what was expected."""


class MissingDependency(RuntimeError):
    """An optional package a command needs is not installed; the message says how to add it."""
