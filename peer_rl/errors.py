"""Errors raised at start-up, shared by the config loader and the modules it draws on."""


class ConfigError(ValueError):
    """A configuration that cannot run: names the key (or file) and what was expected."""
