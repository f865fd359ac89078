"""The layers of ARCHITECTURE.md hold: import-linter's contracts (pyproject.toml), and a lazy registry."""
import ast
import subprocess
import sys

from tests.conftest import ROOT


def test_import_linter_contracts_are_kept():
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0


def test_looking_up_one_entry_imports_no_other():
    """The registry resolves a name by its import path: running one method's lookup imports that method's module and
    what it needs, never the other methods, metrics or teachers."""
    code = ("import sys\n"
            "from core.registry import METHODS, TEACHERS, METRICS\n"
            "assert 'methods.sjd' not in sys.modules\n"
            "METHODS.get('sjd')\n"
            "names = METHODS.names() + TEACHERS.names() + METRICS.names()\n"
            "loaded = sorted(m for m in sys.modules if m.startswith(('methods.', 'metrics.', 'teachers.tiny', "
            "'teachers.pretrained')))\n"
            "print(loaded)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    loaded = ast.literal_eval(out)
    assert "methods.sjd" in loaded and "methods.base" in loaded
    assert not [m for m in loaded if m.startswith(("methods.dd", "methods.ard", "methods.cspd", "methods.sdtt",
                                                     "metrics.", "teachers.tiny", "teachers.pretrained"))], loaded


def test_no_pointer_leaves_the_repository():
    """Comments and docs cite the repository's own pages (docs/), never notes outside a user's clone."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.yaml", "*.md"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    offenders = [f for f in files if not f.startswith("docs/") and (ROOT / f).is_file()
                 and any(p in (ROOT / f).read_text(encoding="utf-8", errors="replace")
                         for p in ("shared" + "/notes", "../" + "shared"))]
    assert not offenders, offenders
