"""The run's configuration: the typed schema every command loads (schema), each worker kind's
settings (worker_settings, importable without the schema), where secrets come from (credentials)
and the generated reference page (doc). Kept light: import the module you need."""
