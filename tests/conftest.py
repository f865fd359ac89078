"""Shared fixtures: an isolated cache and MLflow store per test session, offline hub settings."""
import os
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("ACCELBENCH_ZOO", "off")  # tests build what they use; tests/test_zoo.py names the zoo itself
ROOT = Path(__file__).resolve().parent.parent
PG = "postgresql://postgres@127.0.0.1:5432"


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Torch on one thread, as the runner samples and scores by default (`RunOptions.threads`): the tests' small models
    gain nothing from a second thread, and when another process shares the 2 cores they ran 5-40x slower on two."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture()
def tiny_recipe(monkeypatch):
    """The registered teachers with a seconds-long training recipe (tests/tiny_recipes.py)."""
    from tests.tiny_recipes import recipes

    for cls, recipe in recipes().items():
        monkeypatch.setattr(cls, "recipe", recipe)


@pytest.fixture()
def new_cache(tmp_path, cache, classifier):
    """A new cache folder holding only the digits classifier that FID and KID read, trained once for the session: a
    trial here trains its teacher, as in a new cache, but not the classifier again (~4 s of CPU each)."""
    import shutil

    from core.cache import Cache

    folder = tmp_path / "cache"
    entry = Cache(folder).path("extractors", classifier.info["key"])
    entry.parent.mkdir(parents=True)
    shutil.copyfile(cache.path("extractors", classifier.info["key"]), entry)
    return folder


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A cache shared by the metric tests, so the digits classifier is trained once per session."""
    from core.cache import Cache

    return Cache(tmp_path_factory.mktemp("metric-cache"))


@pytest.fixture(scope="session")
def classifier(cache):
    import torch

    from metrics.extractors import load_classifier

    return load_classifier("digits", 16, cache=cache, device=torch.device("cpu"))


@pytest.fixture(scope="session")
def images():
    """360 digits each: the test split, a train subset, and uniform noise, at the teachers' 16x16."""
    import torch

    from teachers.data.images import load_image_dataset

    g = torch.Generator().manual_seed(1)
    train = load_image_dataset("digits", "train", 16).images
    return {"test": load_image_dataset("digits", "test", 16).images,
            "train": train[torch.randperm(len(train), generator=g)[:360]],
            "noise": torch.rand(360, 1, 16, 16, generator=g)}


@pytest.fixture()
def plugin(monkeypatch):
    """The teachers of tests/plugins.py, registered here for this test only (so no later test sees them in the
    registry, whatever the order) and in every subprocess this test starts."""
    import importlib
    import sys

    from core.registry import TEACHERS

    TEACHERS.names()  # the project's own declarations first: they must outlive the copy below
    monkeypatch.setenv("ACCELBENCH_PLUGINS", "tests.plugins")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setattr(TEACHERS, "_entries", dict(TEACHERS._entries))
    if "tests.plugins" in sys.modules:
        importlib.reload(sys.modules["tests.plugins"])
    else:
        importlib.import_module("tests.plugins")


@pytest.fixture()
def pg_database():
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(f"{PG}/postgres", connect_timeout=3, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL server at {PG}: {str(exc).strip().splitlines()[0]}")
    name = f"accelbench_{uuid.uuid4().hex[:8]}"
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    yield f"{PG}/{name}"
    with admin.cursor() as cur:
        cur.execute(f"DROP DATABASE {name} WITH (FORCE)")
    admin.close()


@pytest.fixture(scope="session")
def migrated_store_file(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store whose tables MLflow's schema migrations made once per session: a copy of the file
    (`fresh_store`) is a new store without them (2-3 s of CPU each)."""
    from bench.tracking import client

    path = tmp_path_factory.mktemp("migrated-store") / "mlflow.db"
    client(f"sqlite:///{path}")
    return path


@pytest.fixture()
def fresh_store(tmp_path, migrated_store_file) -> str:
    """The URI of a new, empty MLflow SQLite store at tmp_path/mlflow.db (a copy of `migrated_store_file`)."""
    import shutil

    shutil.copyfile(migrated_store_file, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path}/mlflow.db"
