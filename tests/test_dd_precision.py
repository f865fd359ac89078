"""DD's precision per arm (issue 47, item 2): the released students compute in float32 beside a bfloat16 LlamaGen
teacher (microsoft/distilled_decoding 3b95d33: eval_fewstep.py:64 and eval_combine_sample.py:66 never cast the
student, eval_combine_sample.py:98 casts the teacher), so `dd`'s student steps run in `student_dtype` (fp32) whatever
the trial's dtype. Checked here: every arm of every trial of suites/papers/dd-*.yaml against the precision table in
its header, and the `dd` arm under a bfloat16 trial sampling what the float32 student does (which
tests/test_dd_released.py proves equal to the official classes)."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench.suite import load_suite
from core import files, precision
from methods import dd_released
from methods.dd import DD, DDConfig, VARDDConfig
from teachers.families import ar_token, multiscale_vq
from teachers.networks.llamagen import LlamaGenGPT
from teachers.networks.var import VAR
from tests.fakes import NO_CHECKPOINTS, make_config, write_release
from tests.test_dd_released import FIXTURES, TINY, TINY_LLAMAGEN, var_like

ROOT = Path(__file__).resolve().parent.parent
DD_SUITES = sorted((ROOT / "suites" / "papers").glob("dd-*.yaml"))
ROW = re.compile(r"^#\s+\|\s*(?P<arm>[^|]+?)\s*\|\s*(?P<dtype>[^|]+?)\s*\|\s*(?P<source>[^|]+?)\s*\|\s*$")


def precision_table(path: Path) -> dict[str, tuple[str, str]]:
    """The header's table: arm -> (dtype, source)."""
    rows = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if (m := ROW.match(line)) and m["arm"] != "arm":
            rows[m["arm"]] = (m["dtype"], m["source"])
    return rows


def arm_dtypes(p) -> dict[str, str]:
    """What each arm of a planned trial computes in: the teacher's arms (the reference arm, the method arm of a
    teacher-only baseline, a DD arm's teacher segment) in the trial's dtype, a DD student in `student_dtype`."""
    family = "VAR" if p.teacher_cls.family is multiscale_vq.FAMILY else "LlamaGen"
    arms = {f"{family} teacher": p.trial.dtype}
    if p.trial.method == "dd":
        arms[f"{family}-DD student"] = p.config.student_dtype
    return arms


@pytest.mark.parametrize("path", DD_SUITES, ids=lambda p: p.stem)
def test_every_dd_arm_runs_the_dtype_of_the_precision_table_in_its_suite_header(path):
    table = precision_table(path)
    assert set(table) == {"VAR teacher", "VAR-DD student", "LlamaGen teacher", "LlamaGen-DD student"}, table
    assert all(re.search(r"\.(py|ipynb):\d+", source) for _, source in table.values()), "every row cites file:line"
    with files.audit():
        plans = load_suite(str(path), checkpoints=NO_CHECKPOINTS).plans
    seen = set()
    for p in plans:
        assert p.trial.tf32, f"{p.trial.teacher} {p.trial.method}: the release runs TF32 (the header)"
        for arm, dtype in arm_dtypes(p).items():
            assert dtype == table[arm][0], f"{path.name}: {p.trial.teacher} {p.trial.method} {arm}: {dtype}"
            seen.add(arm)
    assert seen == set(table)  # every row of the table is some trial's arm


def tiny_dd(official: dict, var: bool, folder: Path, **knobs) -> DD:
    """`dd` with the official fixture's tiny released student (tests/fixtures/dd), 1 step, split after 2 scales or
    tokens (logits head before, embedding head after)."""
    if var:
        teacher = var_like(VAR(TINY), official["codebook"])
        teacher.patch_nums, teacher.seq_len = TINY.patch_nums, sum(n * n for n in TINY.patch_nums)
    else:
        teacher = SimpleNamespace(name="tiny", family=ar_token.FAMILY, network=LlamaGenGPT(TINY_LLAMAGEN),
                                  codebook=official["codebook"], seq_len=TINY_LLAMAGEN.seq_len)
    method = DD(teacher, make_config(VARDDConfig if var else DDConfig, student="tiny.pt", split=2, **knobs))
    write_release(folder / "tiny.pt", official["state_dict"], "var" if var else "llamagen")
    method.student = dd_released.load(folder / "tiny.pt", teacher)
    return method


@pytest.mark.parametrize("var", [False, True], ids=["llamagen", "var"])
def test_the_dd_arm_of_a_bf16_trial_samples_what_the_float32_student_does(var, tmp_path):
    """Under the trial's bfloat16 autocast (`--dtype bf16`, as the LlamaGen rows run), `dd`'s samples equal the same
    arm's in float32 code for code; with `student_dtype=bf16` (the student under the trial's autocast, as before) a
    share of them flip their nearest code."""
    official = torch.load(FIXTURES / ("var_dd_tiny_parity.pt" if var else "llamagen_dd_tiny_parity.pt"),
                          weights_only=True)
    cond = torch.arange(128)[:, None] % 10
    cpu = torch.device("cpu")

    def draw(method: DD, dtype: str) -> torch.Tensor:
        with precision.autocast(cpu, dtype):
            return method.sample(cond, generator=torch.Generator().manual_seed(0)).data

    released = tiny_dd(official, var, tmp_path)
    fp32 = draw(released, "fp32")
    assert torch.equal(draw(released, "bf16"), fp32)
    flipped = (draw(tiny_dd(official, var, tmp_path, student_dtype="bf16"), "bf16") != fp32).float().mean()
    assert flipped > 0.001, flipped  # the bf16 student is told apart: the check above can fail


def test_student_dtype_is_checked_in_one_line():
    with pytest.raises(ValueError, match=r"^student_dtype must be one of fp32, bf16, fp16, got 'fp64'$"):
        DDConfig(student_dtype="fp64")
