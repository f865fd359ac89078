"""`make docs` builds the documentation site with --strict (a broken link or anchor, a page outside the nav, fails),
and its registry reference is generated from the registries: every registered name is on it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cli.store import registry_listing

ROOT = Path(__file__).resolve().parent.parent


def test_the_site_builds_strictly_with_every_registry_entry(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "site" / "reference" / "registry" / "index.html").read_text()
    names = [e.name for entries in registry_listing(None).values() for e in entries]
    assert len(names) > 40
    missing = [n for n in names if f"<code>{n.replace('<', '&lt;').replace('>', '&gt;')}</code>" not in page]
    assert not missing, f"not on the generated registry page: {missing}"
    assert (tmp_path / "site" / "architecture" / "index.html").exists()
