"""The one set of rules for files every command writes: new outputs never over a path the
command did not create, whole-file writes (temporary, fsync, rename), locks and resumable runs
(out_paths), and fsync of trees (durable)."""
