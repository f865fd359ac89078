"""`accelbench zoo build`: rebuild the model zoo from the project's own recipes (see `bench.zoo_build`)."""
from __future__ import annotations

import sys
from pathlib import Path

from cli import options


def cmd_zoo_build(args) -> int:
    from core.cache import PROJECT_ZOO
    from core.config import writable_dir
    from bench.suite import load_suite
    from bench.zoo_build import ZOO_SUITES, build

    suites = [load_suite(str(path), checkpoints=args.checkpoints) for path in args.suite or ZOO_SUITES]
    out = writable_dir(args.out or PROJECT_ZOO, "zoo folder (--out)")
    cache_dir = writable_dir(args.cache_dir, "cache directory (--cache-dir)") if args.cache_dir else None
    if cache_dir is not None and cache_dir.exists() and any(cache_dir.iterdir()):
        print(f"accelbench: note: {cache_dir} is not empty; what it holds is used, not rebuilt", file=sys.stderr)
    manifest = build(suites, Path(out), cache_dir=cache_dir, progress=not args.no_progress)
    print(f"zoo: {len(manifest['entries'])} entries, {manifest['total_xz_bytes'] / 2**20:.1f} MB compressed, built in "
          f"{manifest['seconds'] / 60:.1f} min; manifest: {out / 'manifest.json'}")
    return 0


def register(sub) -> None:
    zp = sub.add_parser("zoo", help="the model zoo shipped with the project (trained teachers and students)")
    zsub = zp.add_subparsers(dest="zoo_command", required=True)
    b = zsub.add_parser("build", help="train every zoo entry the demo and the field suite need, and the Fashion-MNIST "
                                      "classifier, from scratch and write zoo/ (over an hour on 2 CPU cores)")
    b.add_argument("--suite", action="append", help="a suite whose trials the zoo serves, repeatable (default "
                                                    "suites/default.yaml and suites/field.yaml)")
    b.add_argument("--out", help="zoo folder (default zoo/ of the project)")
    b.add_argument("--cache-dir", help="build in this cache folder and keep it (default: a temporary one)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    options.checkpoints(b)
    b.set_defaults(func=cmd_zoo_build)
