"""Text prompts for text-to-image teachers of real checkpoints, read from a local file (nothing is downloaded).

The SJD paper (arXiv:2410.01699, Sec. 4.1; docs/methods/sjd.md) scores its T2I models on MS-COCO 2017 val (5,000
prompts, one caption per image) and on PartiPrompts (1,632). The file is the teacher's setting `prompts`
(`Trial.teacher_params`, a suite's trials name theirs: `teachers.pretrained.prompted.PromptSet`), relative to the
checkpoints folder (`--checkpoints`) or absolute; by default COCO's caption annotations `captions_val2017.json` there.
Three formats, by suffix:
- `.json`: COCO caption annotations; one prompt per image, the first of its captions in the file's order, images in
  id order. The SJD code means to take each image's longest caption but, its running maximum never being reset, in
  effect takes one at a fixed index (docs/methods/sjd.md); the first caption is the plain reading of "one per image".
- `.tsv`: PartiPrompts (`PartiPrompts.tsv`), the column `Prompt`;
- `.txt`: one prompt per non-empty line.
"""
from __future__ import annotations

import csv
from pathlib import Path

from core.cache import CHECKPOINTS_ENV
from core.errors import UserError
from core.files import read_json, read_text

COCO_CAPTIONS = "captions_val2017.json"
FORMATS = (".json", ".tsv", ".txt")


def prompt_file(checkpoints: Path, name: str = COCO_CAPTIONS) -> Path:
    """The prompt file `name`: in the checkpoints folder, unless absolute."""
    return checkpoints / Path(name).expanduser()


def missing_prompts(path: Path) -> str | None:
    """Why the prompt file `path` cannot be read (one line), or None."""
    if path.suffix not in FORMATS:
        return f"prompt file {path}: unknown format {path.suffix!r}; valid: {', '.join(FORMATS)}"
    if not path.is_file():
        what = f"{COCO_CAPTIONS} (MS-COCO 2017 caption annotations)" if path.name == COCO_CAPTIONS else path.name
        return (f"missing {path}: place {what} in {path.parent}, name its folder with --checkpoints or "
                f"{CHECKPOINTS_ENV}, or name another prompt file ({', '.join(FORMATS)}) with the teacher param "
                f"prompts (--teacher-param prompts=FILE; a trial's teacher_params)")
    return None


def read_prompts(path: Path) -> list[str]:
    """The prompts of a file in one of `FORMATS`, in file order (COCO: by image id). A file that is not what its
    suffix says (damaged, not text, JSON without COCO's annotations, a TSV without a `Prompt` column) is one
    `UserError` naming it."""
    if path.suffix == ".json":
        data = read_json(path)
        try:
            first: dict[int, str] = {}
            for a in data["annotations"]:
                first.setdefault(a["image_id"], a["caption"].strip())
            prompts = [first[i] for i in sorted(first)]
        except (KeyError, TypeError, AttributeError):
            raise UserError(f"prompt file {path}: not COCO caption annotations (a mapping whose 'annotations' hold "
                            f"'image_id' and 'caption')") from None
    elif path.suffix == ".tsv":
        rows = list(csv.DictReader(read_text(path).splitlines(), delimiter="\t"))
        if rows and "Prompt" not in rows[0]:
            raise UserError(f"prompt file {path}: no 'Prompt' column (PartiPrompts' TSV); its header: "
                            f"{', '.join(map(str, rows[0]))[:200]}")
        prompts = [(row["Prompt"] or "").strip() for row in rows]
    elif path.suffix == ".txt":
        prompts = [line.strip() for line in read_text(path).splitlines() if line.strip()]
    else:
        raise UserError(f"prompt file {path}: unknown format {path.suffix!r}; valid: {', '.join(FORMATS)}")
    if not prompts:
        raise UserError(f"prompt file {path} holds no prompts")
    return prompts
