"""Text corpora, the by-document split, the BPE tokenizer and packing (teachers.data.text)."""
from __future__ import annotations

import pytest
import torch

from core.cache import Cache
from core.errors import UserError
from teachers.data.text import (FORTUNES_DIR, TextDataRecipe, TextTokenizer, load_documents, load_text_data, pack,
                                split_documents, train_tokenizer)


@pytest.fixture(scope="module")
def wordnet():
    return load_documents("wordnet")


@pytest.fixture(scope="module")
def tokenizer(wordnet):
    return train_tokenizer(wordnet[:3000], 400)


def test_wordnet_glosses_load_without_duplicates(wordnet):
    assert len(wordnet) > 10_000 and len(set(wordnet)) == len(wordnet) and all(d == d.strip() and d for d in wordnet)


def test_split_is_by_document_deterministic_and_stable_under_additions(wordnet):
    s = split_documents(wordnet)
    assert sorted(s["train"] + s["valid"] + s["test"]) == sorted(wordnet)
    assert not set(s["train"]) & set(s["test"]) and not set(s["valid"]) & set(s["test"])
    assert 0.04 < len(s["test"]) / len(wordnet) < 0.06 and 0.04 < len(s["valid"]) / len(wordnet) < 0.06
    more = split_documents(wordnet + ["a brand new document", "and another one"])
    assert set(s["test"]) <= set(more["test"]) and set(s["train"]) <= set(more["train"])


def test_tokenizer_round_trips_any_text_and_trains_deterministically(wordnet, tokenizer):
    texts = ["a living thing that has the ability to act", "héllo wörld 🙂 \t tabs", "\x00\xff odd bytes"]
    assert tokenizer.decode(tokenizer.encode(texts)) == [t.strip() for t in texts]
    assert all(0 <= i < tokenizer.vocab_size for ids in tokenizer.encode(texts) for i in ids)
    assert train_tokenizer(wordnet[:3000], 400).to_json() == tokenizer.to_json()
    again = TextTokenizer.from_json(tokenizer.to_json())
    assert again.encode(texts) == tokenizer.encode(texts) and again.eos_id == tokenizer.eos_id


def test_pack_wraps_documents_with_eos():
    rows = pack([[1, 2], [3], [4, 5, 6]], seq_len=3, eos_id=9)
    assert rows.tolist() == [[1, 2, 9], [3, 9, 4], [5, 6, 9]]
    assert pack([[1]], seq_len=3, eos_id=9).shape == (0, 3)  # the ragged tail is dropped


def test_eos_decodes_as_a_newline(tokenizer):
    ids = tokenizer.encode(["first", "second"])
    assert tokenizer.decode([ids[0] + [tokenizer.eos_id] + ids[1]]) == ["first\nsecond"]


def test_text_data_is_cached_and_keyed_by_the_corpus_content(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"document number {i} says something about {i % 7}" for i in range(400)))
    recipe, cache = TextDataRecipe(corpus=f"file:{corpus}", vocab_size=300, seq_len=8), Cache(tmp_path / "cache")
    a = load_text_data(recipe, cache)
    assert a.chunks["train"].shape[1] == 8 and len(a.chunks["test"]) > 0
    b = load_text_data(recipe, cache)
    assert torch.equal(a.chunks["train"], b.chunks["train"]) and a.corpus_sha == b.corpus_sha
    assert len(list((tmp_path / "cache" / "text-data").iterdir())) == 1
    corpus.write_text(corpus.read_text() + "\n\na new paragraph")
    c = load_text_data(recipe, cache)
    assert c.corpus_sha != a.corpus_sha and len(list((tmp_path / "cache" / "text-data").iterdir())) == 2


def test_folder_corpus_reads_every_txt_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("one\n\ntwo")
    (tmp_path / "sub" / "b.txt").write_text("three")
    (tmp_path / "c.md").write_text("ignored")
    assert load_documents(f"file:{tmp_path}") == ["one", "two", "three"]


def test_bad_corpora_are_clear_errors(tmp_path):
    with pytest.raises(UserError, match="unknown corpus 'nope'; valid: wordnet, fortunes, file:<path>"):
        load_documents("nope")
    with pytest.raises(UserError, match="no such file"):
        load_documents(f"file:{tmp_path / 'missing.txt'}")


@pytest.mark.skipif(not FORTUNES_DIR.is_dir(), reason=f"{FORTUNES_DIR} absent (Debian package `fortunes`)")
def test_fortunes_load():
    docs = load_documents("fortunes")
    assert len(docs) > 1000 and not any(d == "%" for d in docs)
