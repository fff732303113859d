"""Experiment trackers beside metrics.jsonl: Weights & Biases and MLflow, under verl's logger names.

Each tracker receives every step's numeric metrics under the JSONL's own keys, and the run's
config as save_config writes it (secrets as their interpolation, URL credentials as ***) as the
run's parameters. The tracker runs' ids are kept in <output_dir>/trackers.json, so a resumed run
continues the same W&B and MLflow runs. A tracker that fails mid-run (a tracking server gone) is
reported once and dropped: metrics.jsonl stays the run's record and training goes on.
MLflow is sent only the credentials named for its server (peer_rl.config.credentials), and a local
MLflow store is an output like any other: never inside an input (check_mlflow_store).
"""
from __future__ import annotations

import json
import logging
import netrc
import os
import socket
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

from peer_rl.config.credentials import check_key_transport, key_variable, redact_text
from peer_rl.errors import ConfigError
from peer_rl.files.out_paths import read_json, refuse_inside, write_atomic

logger = logging.getLogger(__name__)

STATE_FILE = "trackers.json"


def numeric(metrics: dict) -> dict[str, float]:
    """The values a tracker can chart: numbers (bools excluded), as floats."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def flat_params(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys and string values (lists as JSON)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flat_params(value, name + ".")
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


class WandbTracker:
    """A W&B run in <output_dir>/wandb; offline unless a key is known and the server answers."""

    def __init__(self, out: Path, trainer, name: str, config: dict, run_id: str | None):
        import wandb  # deferred: optional, peer-rl[trackers]

        mode, why = wandb_mode(trainer.wandb.mode)
        logger.info(f"wandb: {mode} ({why})")
        self.run = wandb.init(
            project=trainer.project_name, entity=trainer.wandb.entity or None, name=name,
            dir=str(out), mode=mode, id=run_id, resume="allow" if run_id else None,
            config=config, settings=wandb.Settings(console="off"))
        self.run_id = self.run.id
        if mode == "offline":
            logger.info(f"wandb: run {self.run_id} in {self.run.settings.sync_dir} (upload "
                        "it later with `wandb sync`)")

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(numeric(metrics), step=step)

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


def wandb_mode(setting: str) -> tuple[str, str]:
    """trainer.wandb.mode resolved, and why: auto is online only when a key is known for the
    server and it answers within 3 s."""
    if setting != "auto":
        return setting, f"trainer.wandb.mode={setting}"
    base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    host = urlsplit(base).hostname or "api.wandb.ai"
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
        return "offline", f"WANDB_MODE={os.environ['WANDB_MODE']}"
    if not (os.environ.get("WANDB_API_KEY") or _netrc_has(host)):
        return "offline", "no WANDB_API_KEY and no `wandb login` for " + host
    try:
        socket.create_connection((host, urlsplit(base).port or 443), timeout=3).close()
    except OSError as exc:
        return "offline", f"{host} does not answer: {exc}"
    return "online", f"a key for {host}"


def _netrc_has(host: str) -> bool:
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class MlflowTracker:
    """An MLflow run: the experiment is trainer.project_name, the run is named `name`."""

    def __init__(self, out: Path, trainer, name: str, config: dict, run_id: str | None):
        from mlflow.entities import Param  # deferred: optional, peer-rl[trackers]
        from mlflow.tracking import MlflowClient  # deferred: optional, peer-rl[trackers]

        uri = mlflow_uri(trainer.mlflow.tracking_uri, out)
        # as config.yaml writes it (an `${oc.env:...}` kept), else without its user:password
        shown = (trainer.mlflow.tracking_uri and
                 config.get("trainer", {}).get("mlflow", {}).get("tracking_uri")) or \
            redact_text(uri)
        send_mlflow_credentials(uri, shown, trainer.mlflow)
        with _quiet_store_setup():          # a new store's tables are created here
            try:
                self.client = MlflowClient(tracking_uri=uri)
                experiment = self.client.get_experiment_by_name(trainer.project_name)
            except Exception as exc:        # noqa: BLE001 - any store's error, named
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                raise ConfigError(redact_text(f"trainer.mlflow.tracking_uri: no MLflow store "
                                              f"at {shown} ({why.replace(uri, shown)})")) from None
        exp_id = (experiment.experiment_id if experiment is not None
                  else self.client.create_experiment(trainer.project_name))
        if run_id and self._exists(run_id):
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            logger.info(f"mlflow: continuing run {run_id} at {shown}")
            return               # its parameters were logged when it started
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        # deferred: optional, peer-rl[trackers]
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        params, cut = [], []
        for key, value in flat_params(config).items():
            if len(value) > MAX_PARAM_VAL_LENGTH:          # MLflow refuses longer values
                cut.append(key)
                value = value[:MAX_PARAM_VAL_LENGTH - 3] + "..."
            params.append(Param(key, value))
        self.client.log_batch(self.run_id, params=params)  # MLflow splits it into batches
        if cut:
            logger.info(f"mlflow: parameters cut to {MAX_PARAM_VAL_LENGTH} characters "
                        f"(config.yaml holds them whole): {cut}")
        logger.info(f"mlflow: run {self.run_id} in experiment {trainer.project_name!r} at "
                    f"{shown}")

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException  # deferred: optional, peer-rl[trackers]

        try:
            self.client.get_run(run_id)
            return True
        except MlflowException:
            return False

    def log(self, step: int, metrics: dict) -> None:
        from mlflow.entities import Metric  # deferred: optional, peer-rl[trackers]

        ts = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, ts, step)
                                                    for k, v in numeric(metrics).items()])

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


@contextmanager
def _quiet_store_setup():
    """A new SQLite store's set-up, without its INFO lines and SQLAlchemy's deprecation notes
    (about MLflow's own queries, nothing the user can act on)."""
    loggers = [logging.getLogger(n) for n in ("mlflow", "alembic")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for lg in loggers:
            lg.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def mlflow_uri(setting: str, out: Path) -> str:
    """trainer.mlflow.tracking_uri, else $MLFLOW_TRACKING_URI, else SQLite in the run dir."""
    return setting or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{(out / 'mlflow.db').resolve()}"


MLFLOW_TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
_MLFLOW_LOGIN = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def send_mlflow_credentials(uri: str, shown: str, settings) -> None:
    """Leave in this process's environment, where MLflow reads them for every request, only the
    credentials named for `uri` (peer_rl.config.credentials): the token of trainer.mlflow.token_env,
    else $MLFLOW_TRACKING_TOKEN and the login of $MLFLOW_TRACKING_USERNAME/_PASSWORD when `uri`
    is on the server $MLFLOW_TRACKING_URI names; none over plain http to another host unless
    trainer.mlflow.allow_insecure_http. Only an http(s) server is sent any."""
    if urlsplit(uri).scheme not in ("http", "https"):
        return
    home = os.environ.get("MLFLOW_TRACKING_URI", "")
    var = key_variable(uri, settings.token_env, MLFLOW_TOKEN_ENV, home)
    token = os.environ.get(var, "") if var else ""
    at_home = bool(key_variable(uri, "", MLFLOW_TOKEN_ENV, home))
    login = [v for v in _MLFLOW_LOGIN if os.environ.get(v)] if at_home else []
    sent = var if token else ("MLFLOW_TRACKING_PASSWORD" if "MLFLOW_TRACKING_PASSWORD" in login
                              else "")
    check_key_transport("trainer.mlflow.tracking_uri", uri, sent,
                        "trainer.mlflow.allow_insecure_http", settings.allow_insecure_http,
                        ConfigError)
    withheld = [v for v in (MLFLOW_TOKEN_ENV, *_MLFLOW_LOGIN) if os.environ.get(v)
                and v not in login and not (v == MLFLOW_TOKEN_ENV and token)]
    for v in withheld:
        del os.environ[v]
    if token:                           # MLflow reads the token from this variable only
        os.environ[MLFLOW_TOKEN_ENV] = token
    if withheld:
        logger.warning(f"mlflow: {', '.join('$' + v for v in withheld)} not sent to {shown}: "
                       "not the server $MLFLOW_TRACKING_URI names (trainer.mlflow.token_env="
                       f"{MLFLOW_TOKEN_ENV} sends it the token)")


def mlflow_store(uri: str) -> Path | None:
    """The local path a tracking URI writes (a directory for a path or file:// URI, the database
    file for sqlite:///); None for a server or an in-memory store."""
    parts = urlsplit(uri)
    if parts.scheme == "":
        return Path(uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if parts.scheme == "sqlite":
        path = uri[len("sqlite:///"):].split("?", 1)[0] if uri.startswith("sqlite:///") else ""
        return Path(unquote(path)) if path and path != ":memory:" else None
    return None


def check_mlflow_store(cfg, out: Path, inputs) -> None:
    """A local MLflow store follows the rule every output follows (peer_rl.files.out_paths): not
    an input, not inside an input directory, holding none; checked before anything is written."""
    if "mlflow" not in cfg.trainer.loggers:
        return
    setting = cfg.trainer.mlflow.tracking_uri
    store = mlflow_store(mlflow_uri(setting, out))
    if store is not None:
        refuse_inside(store, inputs, "trainer.mlflow.tracking_uri" if setting else
                      "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else
                      "trainer.output_dir")


_TRACKERS = {"wandb": WandbTracker, "mlflow": MlflowTracker}


class Trackers:
    """The trackers trainer.loggers names, started together, fed together, closed together."""

    def __init__(self, out: Path, trainer, name: str, config: dict, resume: bool):
        state_path = out / STATE_FILE
        ids = read_json(state_path, "tracker run ids") if resume and state_path.exists() else {}
        self.active: dict[str, object] = {}
        for kind in (k for k in trainer.loggers if k in _TRACKERS):
            self.active[kind] = _TRACKERS[kind](out, trainer, name, config, ids.get(kind))
        if self.active:
            write_atomic(state_path, json.dumps(
                {kind: t.run_id for kind, t in self.active.items()}, indent=1))

    def log(self, step: int, metrics: dict) -> None:
        for kind, tracker in list(self.active.items()):
            try:
                tracker.log(step, metrics)
            except Exception as exc:   # noqa: BLE001 - a tracker is never worth the run
                logger.warning(redact_text(f"{kind}: logging step {step} failed "
                                           f"({type(exc).__name__}: {exc}); {kind} is off for "
                                           "the rest of this run, metrics.jsonl has every step"))
                del self.active[kind]

    def close(self, ok: bool = True) -> None:
        for kind, tracker in self.active.items():
            try:
                tracker.close(ok)
            except Exception as exc:   # noqa: BLE001
                logger.warning(redact_text(f"{kind}: closing failed ({type(exc).__name__}: "
                                           f"{exc})"))
        self.active = {}


def open_trackers(cfg, out: Path, resume: bool, config: dict) -> Trackers | None:
    """The run's W&B and MLflow runs, when trainer.loggers names either; `config` is what they
    log as parameters (peer_rl.config.schema.public_config: secrets redacted)."""
    if not any(kind in _TRACKERS for kind in cfg.trainer.loggers):
        return None
    return Trackers(out, cfg.trainer, cfg.experiment_name, config, resume)
