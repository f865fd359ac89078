"""Teachers: the families' contracts, the networks, the data, and the registered teachers.

- `teachers.families`: one module per family (protocol, `SamplingConfig`, the teacher's own sampler): what methods use;
- `teachers.networks`: the transformers (one per file);
- `teachers.data`: datasets, corpora and tokenizers;
- `teachers.tiny`: the embedded tiny teachers, trained here from data that ships with installed packages;
- `teachers.pretrained`: teachers loaded from local checkpoint files.

A registered teacher is a class with `family`, `modality` and the family's protocol, a `key()` classmethod (the
hash of everything that determines its weights; what is derived from it is cached under it) and a
`load(name, *, cache, device)` classmethod; one made of local files is looked up with the checkpoints folder it
reads (`teacher_class`, `load_teacher`). Declared below by import path: importing this package imports none of
them (`core.registry`).
"""
from pathlib import Path
from typing import Any, Mapping

from core.errors import UserError
from core.registry import TEACHERS

TEACHERS.register("digits-ar-c2i", "teachers.tiny.registered:DigitsARClass")
TEACHERS.register("digits-ar-t2i", "teachers.tiny.registered:DigitsARText")
TEACHERS.register("fashion-ar-c2i", "teachers.tiny.registered:FashionARClass")
TEACHERS.register("fashion-ar-t2i", "teachers.tiny.registered:FashionARText")
TEACHERS.register("digits-mar-c2i", "teachers.tiny.registered:DigitsMARClass")
TEACHERS.register("digits-mar-masked-c2i", "teachers.tiny.registered:DigitsMaskedMARClass")
TEACHERS.register("digits-dit-c2i", "teachers.tiny.registered:DigitsDiTClass")
TEACHERS.register("digits-var-c2i", "teachers.tiny.registered:DigitsVARClass")
TEACHERS.register("digits-var-c2i-small", "teachers.tiny.registered:DigitsVARClassSmall")
TEACHERS.register("wordnet-mdlm", "teachers.tiny.registered:WordNetMDLM")
TEACHERS.register("wordnet-gpt", "teachers.tiny.registered:WordNetGPT")
TEACHERS.register("smollm2-135m-instruct", "teachers.pretrained.smollm2:SmolLM2Instruct")
TEACHERS.register("dit-xl-2-256", "teachers.pretrained.dit:OfficialDiT")
TEACHERS.register("dit-xl-2-512", "teachers.pretrained.dit:OfficialDiT512")
TEACHERS.register("llamagen-b-256", "teachers.pretrained.llamagen:LlamaGenGPTB256")
TEACHERS.register("llamagen-b-384", "teachers.pretrained.llamagen:LlamaGenB384")
TEACHERS.register("llamagen-l-256", "teachers.pretrained.llamagen:LlamaGenL256")
TEACHERS.register("llamagen-l-384", "teachers.pretrained.llamagen:LlamaGenL384")
TEACHERS.register("llamagen-xl-384", "teachers.pretrained.llamagen:LlamaGenXL384")
TEACHERS.register("llamagen-xxl-384", "teachers.pretrained.llamagen:LlamaGenXXL384")
TEACHERS.register("llamagen-3b-384", "teachers.pretrained.llamagen:LlamaGen3B384")
TEACHERS.register("llamagen-t2i-xl-256", "teachers.pretrained.llamagen_t2i:LlamaGenT2I")
TEACHERS.register("llamagen-t2i-xl-512", "teachers.pretrained.llamagen_t2i:LlamaGenT2I512")
TEACHERS.register("emu3-gen", "teachers.pretrained.emu3:Emu3Gen")
TEACHERS.register("lumina-mgpt-7b-512", "teachers.pretrained.chameleon:LuminaMGPT512")
TEACHERS.register("lumina-mgpt-7b-768", "teachers.pretrained.chameleon:LuminaMGPT768")
TEACHERS.register("lumina-mgpt-7b-1024", "teachers.pretrained.chameleon:LuminaMGPT1024")
TEACHERS.register("anole-7b", "teachers.pretrained.chameleon:Anole7B")
TEACHERS.register("var-d16", "teachers.pretrained.var:VARd16")
TEACHERS.register("var-d20", "teachers.pretrained.var:VARd20")
TEACHERS.register("var-d24", "teachers.pretrained.var:VARd24")
TEACHERS.register("var-d30", "teachers.pretrained.var:VARd30")
TEACHERS.register("mar-h", "teachers.pretrained.mar:MARH")
TEACHERS.register("mar-l", "teachers.pretrained.mar:MARL")
TEACHERS.register("mdlm-owt", "teachers.pretrained.mdlm_owt:MDLMOWT")
TEACHERS.register("mdlm-owt-prompted", "teachers.pretrained.mdlm_owt:MDLMOWTPrompted")
TEACHERS.register_prefix("hf:", "teachers.pretrained.hf_folder:teacher_class")  # hf:<folder>, any causal LM

_LOADED: dict[tuple, Any] = {}  # a suite or sweep runs many trials per process: load each teacher once


def teacher_class(name: str, checkpoints: Path, params: Mapping[str, Any] | None = None) -> type:
    """The registered teacher `name`; one made of local files reads them in `checkpoints` (`--checkpoints`), with the
    settings `params` (`Trial.teacher_params`, checked by `LocalFilesTeacher.at`); another takes none."""
    cls = TEACHERS.get(name)
    if hasattr(cls, "at"):
        return cls.at(checkpoints, params)
    if params:
        raise UserError(f"teacher {name!r} takes no teacher_params, got {', '.join(sorted(params))}")
    return cls


def load_teacher(name: str, *, cache, device, checkpoints: Path, params: Mapping[str, Any] | None = None):
    """The registered teacher `name` (its files in `checkpoints`, its settings `params`), loaded (or trained, and
    reported: `core.training.report_training`) once per process, cache root and device: the runner's teacher, SDTT's
    causal-LM arm and the gen-PPL evaluators all come from here."""
    cls = teacher_class(name, checkpoints, params)
    key = (name, cls.key(), tuple(sorted(getattr(cls, "settings", {}).items())), str(cache.root), str(device))
    if key not in _LOADED:
        _LOADED[key] = cls.load(name, cache=cache, device=device)
    return _LOADED[key]
