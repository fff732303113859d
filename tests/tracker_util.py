"""What a run logged to W&B and MLflow, read back through each library's own reader: W&B's
`wandb leet inspect --json` over the run's .wandb transaction logs, MLflow's MlflowClient."""
import json
import subprocess
import sys
import warnings
from pathlib import Path


def wandb_records(out: Path) -> list[dict]:
    """Every record of every .wandb log under out/wandb, in the order the runs were written."""
    wandb = Path(sys.executable).parent / "wandb"
    records = []
    for log in sorted((out / "wandb").glob("offline-run-*/run-*.wandb")):
        proc = subprocess.run([str(wandb), "leet", "inspect", "--json", str(log)],
                              capture_output=True, text=True, timeout=120, check=True)
        records += [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return records


def wandb_history(out: Path) -> dict[int, dict]:
    """step -> the logged values (W&B's own _step/_runtime/_timestamp left out); a step logged
    again (a resumed run) takes its last values."""
    steps: dict[int, dict] = {}
    for rec in wandb_records(out):
        if rec["type"] == "history":
            item = rec["history"]["item"]
            steps[int(item["_step"])] = {k: v for k, v in item.items() if not k.startswith("_")}
    return steps


def mlflow_history(uri: str, run_id: str) -> dict[int, dict]:
    """step -> every metric's value at that step (the latest logged, as MLflow's UI shows)."""
    from mlflow.tracking import MlflowClient

    steps: dict[int, dict] = {}
    with warnings.catch_warnings():        # SQLAlchemy's notes on MLflow's own queries
        warnings.simplefilter("ignore", DeprecationWarning)
        client = MlflowClient(tracking_uri=uri)
        for key in client.get_run(run_id).data.metrics:
            for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
                steps.setdefault(m.step, {})[key] = m.value
    return steps
