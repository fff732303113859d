"""`peer-rl plot RUN_DIR --out DIR`: a training run's figures drawn again from its files, while
it runs, after it stopped, or for a run from an older peer-rl."""
from __future__ import annotations

from pathlib import Path

from peer_rl.cli.errors import CommandError


def register(sub) -> None:
    p = sub.add_parser("plot", help="draw a training run's figures again from its directory",
                       description="peer-rl plot RUN_DIR --out DIR [--force]: curves.png and "
                       "timeline.png of the `peer-rl train` run in RUN_DIR (its metrics.jsonl "
                       "and timeline.jsonl), written into DIR. A run draws them itself after "
                       "every checkpoint and at its end.")
    p.add_argument("run", metavar="RUN_DIR", help="a `peer-rl train` output directory")
    p.add_argument("--out", required=True, metavar="DIR", help="where the figures go")
    p.add_argument("--force", action="store_true", help="replace this command's earlier output")
    p.set_defaults(fn=_plot, errors=_errors)


def _errors() -> dict:
    from peer_rl.files.out_paths import DamagedFile, OutputError  # deferred (--help)

    return {OutputError: 2, DamagedFile: 2}


def _run_settings(run: Path) -> tuple[str, int]:
    """(experiment name, staleness) from the run's config.yaml; the directory's name and 0
    where it has none."""
    from omegaconf import OmegaConf  # deferred (--help)

    if not (run / "config.yaml").is_file():
        return run.name, 0
    cfg = OmegaConf.load(run / "config.yaml")
    return (str(OmegaConf.select(cfg, "experiment_name", default=run.name)),
            int(OmegaConf.select(cfg, "trainer.async_training.staleness", default=0) or 0))


def _plot(args) -> int:
    from peer_rl.files.out_paths import claim_dir  # deferred (--help)
    from peer_rl.trainer.figures import METRICS_FILE, draw_figures  # deferred: matplotlib

    run = Path(args.run)
    if not (run / METRICS_FILE).is_file():
        raise CommandError(f"{run}: holds no {METRICS_FILE}; expected the output directory "
                           "of a `peer-rl train` run (trainer.output_dir) with a step logged")
    experiment, staleness = _run_settings(run)
    out = claim_dir(args.out, "plot", [run], force=args.force)
    drawn = draw_figures(run, out, experiment, staleness)
    if not drawn:
        raise CommandError(f"{run / METRICS_FILE}: no step to draw yet")
    for path in drawn:
        print(path)
    return 0
