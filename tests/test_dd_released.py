"""DD's released students (microsoft/distilled_decoding, `methods.dd_released`): parity with the official `DD_Model`
(VAR) and `DDTransformer` (LlamaGen) on tiny random weights, the full-size key sets, the released file layouts, and
`dd --param student=...` through the CLI on the tiny VAR and LlamaGen (tests/fixtures/dd/MAKING.md says how the
fixtures were made)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from core.errors import UserError
from methods import dd_released
from methods.dd_released import BUFFERS, ReleasedLlamaGenDD, ReleasedVARDD
from teachers.families import ar_token, multiscale_vq
from teachers.networks.llamagen import LlamaGenConfig, LlamaGenGPT, size_config
from teachers.networks.var import VAR, VARConfig
from tests.fakes import assert_release_keys, write_dd_student, write_release

FIXTURES = Path(__file__).parent / "fixtures" / "dd"
TINY = VARConfig(depth=2, num_classes=10, vocab_size=64, Cvae=8, patch_nums=(1, 2, 3, 4), embed_dim=32, num_heads=2)


def var_like(network, codebook, name="tiny"):
    return SimpleNamespace(name=name, family=multiscale_vq.FAMILY, network=network, codebook=codebook)


@pytest.fixture(scope="module")
def official():
    return torch.load(FIXTURES / "var_dd_tiny_parity.pt", weights_only=True)


@pytest.fixture(scope="module")
def student(official, tmp_path_factory):
    path = tmp_path_factory.mktemp("release") / "var-tiny.pth"
    write_release(path, official["state_dict"])
    return dd_released.load(path, var_like(VAR(TINY), official["codebook"]))


def test_the_released_student_computes_what_dd_model_does(official, student):
    """`DD_Model.forward` at t = 0 and 2 known scales, and `sample.py`'s loop (t_list, loss_split_t) from the same
    noise, within 1e-5; the family's ids are the nearest codes of the released sequence."""
    f = official
    for t, out in f["forward"].items():
        emb, logits = student(f["labels"], f["x_in"], student.ends[t])  # the code's t counts scales
        torch.testing.assert_close(emb, out["x_BLCv"], atol=1e-5, rtol=0)
        torch.testing.assert_close(logits, out["logits"], atol=1e-5, rtol=0)
    cond = f["labels"][:, None]
    for key, ref in f["samples"].items():  # "t_list/split", e.g. "0,2/3": 2 steps {1, 3}, logits before scale 3
        t_list, split = [int(t) for t in key.split("/")[0].split(",")], student.ends[int(key.split("/")[1])]
        x, noise = f["noise"], f["noise"]
        for t in t_list:
            k = student.ends[t]
            x = student.step(f["labels"], torch.cat([x[:, :k], noise[:, k:]], 1), k, split)
        torch.testing.assert_close(x, ref, atol=1e-5, rtol=0)
        if split >= student.ends[t_list[-1]]:  # what `dd` samples (ids between the steps) is then the same
            ids = torch.zeros(3, x.shape[1], dtype=torch.long)
            for t in t_list:
                ids = student.predict(cond, ids, noise, student.ends[t], split)
            assert torch.equal(ids, student.nearest(ref)), key


def test_app_b_attention_is_not_the_released_one(official, student):
    """Broken variant: App. B's attention (tokens of a step see each other) in place of the released bias (earlier
    scales and itself) changes the output."""
    f = official
    bias = student.attn_bias
    level = student.lvl_1L[0]
    try:
        student.attn_bias = torch.where(level[None, :] <= level[:, None], 0.0, -torch.inf)[None, None]
        emb, _ = student(f["labels"], f["x_in"], 0)
    finally:
        student.attn_bias = bias
    assert (emb - f["forward"][0]["x_BLCv"]).abs().max() > 1e-3


@pytest.mark.parametrize("depth", [16, 20, 24])
def test_full_size_key_sets_are_the_released_ones(depth):
    """VAR-d16/20/24-DD (327 M, 635 M, 1.09 B): our network's keys and shapes are the official DD_Model's (listed by
    the official code in var_dd_keys.json) less the buffers computed here."""
    official = json.loads((FIXTURES / "var_dd_keys.json").read_text())[f"var-d{depth}"]
    with torch.device("meta"):
        net = ReleasedVARDD(VAR(VARConfig(depth=depth)), torch.empty(4096, 32))
    read = lambda keys: {k: list(s) for k, s in keys if k.rsplit(".", 1)[-1] not in BUFFERS}  # noqa: E731
    assert read((k, v.shape) for k, v in net.state_dict().items()) == read(official.items())
    params = sum(p.numel() for p in net.parameters())
    paper = {16: 327e6, 20: 635e6, 24: 1.09e9}[depth]  # Table 1's #Para of the DD rows (328.2 M, 635.4 M, 1.092 B)
    assert abs(params / paper - 1) < 0.005


def test_a_full_size_release_loads_on_the_real_teachers_codebook():
    """VAR-d16-DD's state dict with exactly the release's keys and shapes (var_dd_keys.json, listed by the official
    code, buffers included) loads on a d16 teacher whose codebook is the VQ's `nn.Parameter`, as the real teacher's
    is; a student keeping that parameter as its own key refused every released file ("missing keys ['codebook']")."""
    official = json.loads((FIXTURES / "var_dd_keys.json").read_text())["var-d16"]
    with torch.device("meta"):
        state = {k: torch.empty(shape) for k, shape in official.items()}
        teacher = var_like(VAR(VARConfig(depth=16)), torch.nn.Parameter(torch.empty(4096, 32)), "var-d16")
        net = dd_released.from_state(state, teacher, "var-d16.pth")
    assert "codebook" not in net.state_dict() and net.codebook.shape == (4096, 32)


def test_a_fake_release_with_a_key_of_ours_is_refused_by_its_writer(official, official_llamagen):
    """Broken variants of the check every fake student file passes (tests/fakes.py `write_dd_student`): a key our
    class once wrote and no release has (`codebook`), a persistent buffer the release saves left out, and a shape
    other than the release's all fail."""
    var, llamagen = official["state_dict"], official_llamagen["state_dict"]
    assert_release_keys(var, var, dims={})
    for broken in ({**var, "codebook": official["codebook"]}, {k: v for k, v in var.items() if k != "lvl_1L"}):
        with pytest.raises(AssertionError, match="keys the release lacks|release keys missing"):
            assert_release_keys(broken, var)
    with pytest.raises(AssertionError, match="shapes .* differ: {'tok_embeddings.weight'"):
        assert_release_keys({**llamagen, "tok_embeddings.weight": llamagen["tok_embeddings.weight"].T}, llamagen,
                            dims={})


def test_a_file_that_is_not_a_release_or_does_not_fit_is_one_line(official, tmp_path):
    teacher = var_like(VAR(TINY), official["codebook"])
    torch.save(official["state_dict"], tmp_path / "raw.pth")
    with pytest.raises(UserError, match="not a released DD file \\(no trainer -> ema_parameters"):
        dd_released.load(tmp_path / "raw.pth", teacher)
    write_release(tmp_path / "short.pth", {k: v for k, v in official["state_dict"].items() if "final_layer" not in k})
    with pytest.raises(UserError, match="does not fit teacher 'tiny': missing keys.*final_layer_conti"):
        dd_released.load(tmp_path / "short.pth", teacher)
    wide = var_like(VAR(VARConfig(**{**TINY.__dict__, "embed_dim": 64})), official["codebook"], "wide")
    with pytest.raises(UserError, match="does not fit teacher 'wide'"):
        dd_released.load(tmp_path / "short.pth", wide)


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_dd_with_a_released_student_from_the_cli(plugin, tmp_path, capsys):
    """`dd --param student=<file>` on `tiny-var`: a tiny random student in the released layout sampled in 1 and 2
    steps and pre-trained-2-3 (nothing trained); a missing file is one line naming it and --checkpoints, before any
    work."""
    from mlflow.tracking import MlflowClient

    import cli

    # exactly the keys `DD_Model.state_dict()` writes at this depth (the official fixture's, asserted), the buffers
    # the official model saves included; never what our own class would write
    write_dd_student(tmp_path / "var-dd-tiny.pth", "TinyVAR")
    store = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["run", "--teacher", "tiny-var", "--method", "dd", "--n-samples", "4", "--batch-size", "2",
            "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--experiment", "rel", "--warmup", "0",
            "--no-progress", "--checkpoints", str(tmp_path), "--param", "student=var-dd-tiny.pth"]
    assert cli.main(args) == 0
    assert cli.main([*args, "--param", "steps=2", "--param", "t2=3"]) == 0
    assert cli.main([*args, "--param", "steps=2", "--param", "t2=3", "--param", "ts=2"]) == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("rel").experiment_id])
    # pre-trained-2-3: two student steps and one teacher pass (it reads scale 1 and gives scale 2's logits)
    assert sorted(r.data.metrics["nfe_per_sample"] for r in runs) == [1, 2, 3]
    assert all(r.data.params["student"] == "var-dd-tiny.pth" for r in runs)
    assert not (tmp_path / "cache" / "dd-pairs").exists()  # a released student trains nothing
    capsys.readouterr()
    assert cli.main([*args[:-1], "student=var-d16.pth"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"missing {tmp_path}/var-d16.pth" in err and "--checkpoints" in err
    assert len(client.search_runs([client.get_experiment_by_name("rel").experiment_id])) == 3  # refused at plan time


def test_released_defaults_follow_the_released_commands():
    """With a student and no t2/split, VAR-d16 samples at {1, 6} with split 5 and d20/d24 at {1, 5} with split 4
    (VAR/README.md), LlamaGen-B and -L at {1, 81} with split 80 and 130 (LlamaGen/README.md); a student on a teacher
    of neither network is refused in one line."""
    from methods.dd import DD, DDConfig, VARDDConfig
    from tests.fakes import make_config, tiny_gpt_teacher

    for depth, t2, split in ((16, 6, 55), (20, 5, 30), (24, 5, 30)):
        teacher = SimpleNamespace(family=multiscale_vq.FAMILY, patch_nums=VARConfig().patch_nums, seq_len=680,
                                  network=SimpleNamespace(cfg=VARConfig(depth=depth)), codebook=None)
        method = DD(teacher, make_config(VARDDConfig, student="s.pth", steps=2))
        assert (method.t2, method.split) == (t2, split)
    for size, split in (("GPT-B", 80), ("GPT-L", 130)):
        teacher = SimpleNamespace(family=ar_token.FAMILY, seq_len=256, codebook=None,
                                  network=SimpleNamespace(cfg=size_config(size, 256), cls_embedding=0, layers=0,
                                                          norm=0, rope=0))
        method = DD(teacher, make_config(DDConfig, student="s.pth", steps=2))
        assert (method.t2, method.split) == (81, split)
    with pytest.raises(UserError, match="released DD students are VAR's .* and LlamaGen's"):
        DD(tiny_gpt_teacher(), make_config(DDConfig, student="s.pth"))
    assert not DD.trains(make_config(VARDDConfig, student="s.pth")) and DD.trains(VARDDConfig())


# ---- LlamaGen ----------------------------------------------------------------------------------------------------
TINY_LLAMAGEN = LlamaGenConfig(vocab_size=32, num_classes=10, seq_len=16, n_layer=2, n_head=4, n_embd=32,
                               ffn_hidden=96)  # the fixture's: tests/fakes.py TinyLlamaGen's size


@pytest.fixture(scope="module")
def official_llamagen():
    return torch.load(FIXTURES / "llamagen_dd_tiny_parity.pt", weights_only=True)


@pytest.fixture(scope="module")
def llamagen_student(official_llamagen, tmp_path_factory):
    path = tmp_path_factory.mktemp("release") / "llamagen-tiny.pt"
    write_release(path, official_llamagen["state_dict"], "llamagen")
    teacher = SimpleNamespace(name="tiny", family=ar_token.FAMILY, network=LlamaGenGPT(TINY_LLAMAGEN),
                              codebook=official_llamagen["codebook"])
    return dd_released.load(path, teacher)


def test_the_released_llamagen_student_computes_what_ddtransformer_does(official_llamagen, llamagen_student):
    """`DDTransformer.forward` at 0 and 5 known tokens, and `eval_fewstep.py`'s loop (t_list, split_t) from the same
    noise, within 1e-5 (splits before and after the known tokens); the ids `dd` samples are its nearest codes."""
    f, student = official_llamagen, llamagen_student
    for t, out in f["forward"].items():
        emb, logits = student(f["labels"], f["x_in"], t)
        torch.testing.assert_close(emb, out["tokens"], atol=1e-5, rtol=0)
        torch.testing.assert_close(logits, out["logits"], atol=1e-5, rtol=0)
    for key, ref in f["samples"].items():
        t_list, split = [int(t) for t in key.split("/")[0].split(",")], int(key.split("/")[1])
        x, noise = f["noise"], f["noise"]
        for t in t_list:
            x = student.step(f["labels"], torch.cat([x[:, :t], noise[:, t:]], 1), t, split)
        torch.testing.assert_close(x, ref, atol=1e-5, rtol=0)
        if split >= t_list[-1]:
            ids = torch.zeros(3, x.shape[1], dtype=torch.long)
            for t in t_list:
                ids = student.predict(f["labels"][:, None], ids, noise, t, split)
            assert torch.equal(ids, student.nearest(ref)), key


def test_llamagen_class_token_rotation_matters(official_llamagen, llamagen_student):
    """Broken variant: the class token rotated by the identity (standard RoPE at position 0) instead of LlamaGen's
    all-zero rotation changes the output."""
    f, student = official_llamagen, llamagen_student
    rope = student.rope
    try:
        student.rope = rope.clone()
        student.rope[0, :, 0] = 1.0  # cos 1, sin 0
        emb, _ = student(f["labels"], f["x_in"], 0)
    finally:
        student.rope = rope
    assert (emb - f["forward"][0]["tokens"]).abs().max() > 1e-3


@pytest.mark.parametrize("size,params", [("GPT-B", 98_321_672), ("GPT-L", 326_155_272)])
def test_full_size_llamagen_key_sets_are_the_released_ones(size, params):
    """LlamaGen-B/L-DD (Table 1: 98.3 M, 326 M): keys and shapes equal the official DDTransformer's at 256 px."""
    official = json.loads((FIXTURES / "llamagen_dd_keys.json").read_text())[size]
    with torch.device("meta"):
        net = ReleasedLlamaGenDD(LlamaGenGPT(size_config(size, 256)), torch.empty(16384, 8))
    assert {k: list(v.shape) for k, v in net.state_dict().items()} == official
    assert sum(p.numel() for p in net.parameters()) == params


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_dd_with_a_released_llamagen_student_from_the_cli(plugin, tmp_path):
    """`dd --param student=<file>` on `tiny-llamagen`: a tiny random student in the released layout (`ema`), 2 steps
    and pre-trained-2-3 (the teacher between the student's steps)."""
    from mlflow.tracking import MlflowClient

    import cli

    write_dd_student(tmp_path / "llamagen-tiny.pt", "TinyLlamaGen")  # the official fixture's keys and shapes
    store = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["run", "--teacher", "tiny-llamagen", "--method", "dd", "--n-samples", "4", "--batch-size", "2",
            "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--experiment", "rel", "--warmup", "0",
            "--no-progress", "--checkpoints", str(tmp_path), "--param", "student=llamagen-tiny.pt",
            "--param", "steps=2", "--param", "t2=3"]
    assert cli.main(args) == 0
    assert cli.main([*args, "--param", "ts=2"]) == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("rel").experiment_id])
    # pre-trained-2-3: two student steps and one teacher pass (the prefix read with the class token gives token 2)
    assert sorted(r.data.metrics["nfe_per_sample"] for r in runs) == [2, 2 + 1]
