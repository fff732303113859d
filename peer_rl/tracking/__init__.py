"""What a run reports: step metrics and their sinks (metrics), the experiment trackers
(trackers: wandb, MLflow, TensorBoard) and the PNG figures (plot)."""
