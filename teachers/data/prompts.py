"""Text prompts for text-to-image teachers of real checkpoints, read from a local file (nothing is downloaded).

The SJD paper (arXiv:2410.01699, Sec. 4.1; sjd note §2.2) scores its text-to-image models on MS-COCO 2017 val (5,000
prompts, one caption per image) and on PartiPrompts (1,632). The file is `$ACCELBENCH_PROMPTS`, else COCO's caption
annotations `captions_val2017.json` in the checkpoints folder (`--checkpoints`). Three formats, by suffix:
- `.json`: COCO caption annotations; one prompt per image, the first of its captions in the file's order, images in
  id order. The SJD code means to take each image's longest caption but, its running maximum never being reset, in
  effect takes one at a fixed index (sjd note §2.2); the first caption is the plain reading of "one per image".
- `.tsv`: PartiPrompts (`PartiPrompts.tsv`), the column `Prompt`;
- `.txt`: one prompt per non-empty line.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from bench.cache import CHECKPOINTS_ENV, checkpoint_dir
from bench.errors import UserError

PROMPTS_ENV = "ACCELBENCH_PROMPTS"
COCO_CAPTIONS = "captions_val2017.json"
FORMATS = (".json", ".tsv", ".txt")


def prompt_file() -> Path:
    """`$ACCELBENCH_PROMPTS`, else `captions_val2017.json` in the checkpoints folder."""
    if os.environ.get(PROMPTS_ENV):
        return Path(os.environ[PROMPTS_ENV]).expanduser()
    return checkpoint_dir() / COCO_CAPTIONS


def missing_prompts(path: Path) -> str | None:
    """Why the prompt file `path` cannot be read (one line), or None."""
    if path.suffix not in FORMATS:
        return f"prompt file {path}: unknown format {path.suffix!r}; valid: {', '.join(FORMATS)}"
    if not path.is_file():
        return (f"missing {path}: place {COCO_CAPTIONS} (MS-COCO 2017 caption annotations) in {path.parent}, name "
                f"its folder with --checkpoints or {CHECKPOINTS_ENV}, or name a prompt file ({', '.join(FORMATS)}) "
                f"with {PROMPTS_ENV}")
    return None


def read_prompts(path: Path) -> list[str]:
    """The prompts of a file in one of `FORMATS`, in file order (COCO: by image id)."""
    if path.suffix == ".json":
        annotations = json.loads(path.read_text())["annotations"]
        first: dict[int, str] = {}
        for a in annotations:
            first.setdefault(a["image_id"], a["caption"].strip())
        prompts = [first[i] for i in sorted(first)]
    elif path.suffix == ".tsv":
        with path.open(newline="") as fh:
            prompts = [row["Prompt"].strip() for row in csv.DictReader(fh, delimiter="\t")]
    elif path.suffix == ".txt":
        prompts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    else:
        raise UserError(f"prompt file {path}: unknown format {path.suffix!r}; valid: {', '.join(FORMATS)}")
    if not prompts:
        raise UserError(f"prompt file {path} holds no prompts")
    return prompts
