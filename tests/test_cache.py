"""Cache integrity: every entry carries its key and a checksum; corrupt entries are reported and rebuilt, never loaded;
concurrent builds of one key produce one entry."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from core.cache import MAGIC, Cache


def _build(value):
    calls = []

    def build():
        calls.append(1)
        return {"w": torch.full((100,), float(value))}

    return build, calls


def _corrupt_truncate(path):
    path.write_bytes(path.read_bytes()[:-7])


def _corrupt_flip(path):
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # inside the payload: the header still parses, the checksum does not match
    path.write_bytes(bytes(data))


def _corrupt_legacy(path):
    torch.save({"w": torch.zeros(100)}, path)  # a bare torch file, as the cache wrote before it had headers


def _corrupt_other_key(path):
    path.write_bytes(path.with_name("other.pt").read_bytes())


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_flip, _corrupt_legacy, _corrupt_other_key])
def test_a_corrupt_entry_is_reported_and_rebuilt_never_loaded(tmp_path, capsys, corrupt):
    cache = Cache(tmp_path)
    cache.save("things", "other", {"w": torch.full((100,), 7.0)})
    obj, cached = cache.get_or_build("things", "k", _build(1)[0])
    assert not cached and cache.path("things", "k").read_bytes().startswith(MAGIC)
    corrupt(cache.path("things", "k"))
    build, calls = _build(1)
    obj, cached = cache.get_or_build("things", "k", build)
    assert not cached and calls == [1] and torch.equal(obj["w"], torch.ones(100))
    err = capsys.readouterr().err
    assert "cache entry" in err and "corrupt" in err and str(cache.path("things", "k")) in err
    again, cached = cache.get_or_build("things", "k", lambda: pytest.fail("rebuilt a sound entry"))
    assert cached and torch.equal(again["w"], torch.ones(100))


def test_a_failed_build_leaves_no_entry_and_no_temp_file(tmp_path):
    cache = Cache(tmp_path)

    def build():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_build("things", "k", build)
    assert cache.load("things", "k") is None
    assert not list(tmp_path.glob("things/*"))


BUILDER = """
import os, sys, time, torch
from core.cache import Cache
def build():
    with open(sys.argv[2], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    time.sleep(1.5)  # long enough that both processes are inside get_or_build at once
    return {"pid": os.getpid()}
obj, cached = Cache(sys.argv[1]).get_or_build("things", "k", build)
print(obj["pid"], cached)
"""


def test_two_processes_building_one_key_build_it_once(tmp_path):
    log = tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(BUILDER), str(tmp_path / "c"), str(log)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(log.read_text().split()) == 1  # one build
    assert outs[0][0] == outs[1][0] == log.read_text().split()[0]  # both hold the one entry
    assert sorted(o[1] for o in outs) == ["False", "True"]


def test_an_entry_comes_from_the_zoo_when_it_matches_and_is_verified(tmp_path, capsys):
    import hashlib
    import json
    import lzma

    from core.cache import Cache, ModelZoo, encode

    zoo_dir = tmp_path / "zoo"
    (zoo_dir / "teachers").mkdir(parents=True)
    data = encode("teachers", "k1", {"w": torch.arange(3)})
    (zoo_dir / "teachers" / "k1.pt.xz").write_bytes(lzma.compress(data))
    entry = {"kind": "teachers", "key": "k1", "file": "teachers/k1.pt.xz", "bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest()}
    (zoo_dir / "manifest.json").write_text(json.dumps({"entries": [entry]}))
    cache = Cache(tmp_path / "cache", zoo=ModelZoo(zoo_dir))
    obj, cached = cache.get_or_build("teachers", "k1", lambda: pytest.fail("built although the zoo has it"))
    assert cached and torch.equal(obj["w"], torch.arange(3)) and cache.path("teachers", "k1").is_file()
    assert cache.get_or_build("teachers", "k2", lambda: {"w": 1}) == ({"w": 1}, False)  # not in the zoo: built
    # a zoo file that does not match its sha256 is reported and the entry built instead
    (zoo_dir / "teachers" / "k1.pt.xz").write_bytes(lzma.compress(data[:-1] + b"x"))
    other = Cache(tmp_path / "other", zoo=ModelZoo(zoo_dir))
    assert other.get_or_build("teachers", "k1", lambda: {"w": 2}) == ({"w": 2}, False)
    assert "model zoo entry teachers/k1 is unusable" in capsys.readouterr().err
