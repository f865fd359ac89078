"""Tiny random-weight Chameleon folders (transformers' `save_pretrained`) with Lumina-mGPT's and Anole's special
tokens, and the VQGAN parity fixture's files: the Lumina-mGPT and Anole loaders (teachers/pretrained/chameleon.py)
proved without the weights (`tiny-lumina` and `tiny-anole` in tests/plugins.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from teachers.pretrained.chameleon import (DROPPED, NEWLINE, QK_NORMS, SEPARATOR, START, END, VQGAN, Anole7B,
                                           LuminaMGPT768, size_token)
from tests.fakes import FIXTURES, _files, assert_release_keys

CHAMELEON_PROMPTS = ("a photo of a cat", "a red bus on a street", "two dogs playing in the snow", "a bowl of fruit")
N_IMAGE_TOKENS = 6  # codes 0..5 of the fixture's 32-code VQGAN


def image_token(code: int) -> str:
    """The vocabulary's name of a VQGAN code: its digits written A-J between IMGIMG and Z (Chameleon's
    `text_tokenizer.json`; transformers' `ChameleonImageVocabularyMapping.bpe2img`)."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def _write_chameleon(folder: Path) -> None:
    """A tiny random Chameleon (hidden 32, 2 layers, 2 heads; its QK norms random, one vector repeated over the heads
    as Lumina-mGPT's per-shard weights are) with a byte-level BPE tokenizer holding the special tokens and the image
    tokens, in `Chameleon-tiny`; the same weights with the QK norms stored (1, head_dim), as Lumina-mGPT's files
    hold them, in `Lumina-tiny`; a prompt file; and the VQGAN parity fixture's files in `chameleon/tokenizer/`."""
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration, PreTrainedTokenizerFast

    specials = ["<s>", "</s>", "<pad>", START, END, NEWLINE, SEPARATOR, size_token(1), size_token(2),
                *(image_token(k) for k in range(N_IMAGE_TOKENS))]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator([*CHAMELEON_PROMPTS, "Generate an image of 32x32 according to the following prompt:\n"],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        sep_token=SEPARATOR)
    config = ChameleonConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=2, intermediate_size=37, max_position_embeddings=256,
                             vocabulary_map=tokenizer.get_vocab(), pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                             vq_config={"embed_dim": 8, "num_embeddings": 32, "base_channels": 32,
                                        "channel_multiplier": [1], "latent_channels": 8, "resolution": 8})
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = ChameleonForConditionalGeneration(config)
        for name, p in model.named_parameters():
            if "_norm." in name:  # q_norm / k_norm (heads, head_dim): one random vector per layer, every head
                p.data[:] = (1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn(p.shape[-1])
    for name in ("Chameleon-tiny", "Lumina-tiny"):
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    for shard in (folder / "Lumina-tiny").glob("*.safetensors"):
        state = load_file(shard)
        save_file({k: v[:1].contiguous() if "_norm." in k and v.dim() == 2 else v for k, v in state.items()}, shard,
                  metadata={"format": "pt"})
    _assert_official_keys(folder)
    (folder / "prompts.txt").write_text("\n".join(CHAMELEON_PROMPTS) + "\n")
    for name in VQGAN:  # the VQGAN parity fixture's decoder where Lumina-mGPT's README puts Chameleon's
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / "chameleon_vqgan" / Path(name).name, folder / name)


def _assert_official_keys(folder: Path) -> None:
    """The tiny folders hold the key names of what Lumina-mGPT's own module writes (tests/fixtures/chameleon, the 7B:
    32 layers, so names without their layer index) but for the VQ-VAE encoder the loader drops (the tiny one has
    another depth); Lumina-tiny's QK norms have the official (shards, head_dim) rows. Anole's release has no official
    fixture: its folder, Chameleon-tiny, is held to the same names, transformers' (tests/test_chameleon_keys.py)."""
    import json

    from safetensors.torch import load_file

    official = json.loads((FIXTURES / "chameleon" / "Lumina-mGPT-7B.keys.json").read_text())
    kept = {k: v for k, v in official["keys"].items() if not k.startswith(DROPPED)}
    states = {name: {k: v for f in (folder / name).glob("*.safetensors") for k, v in load_file(f).items()}
              for name in ("Chameleon-tiny", "Lumina-tiny")}
    for state in states.values():
        assert_release_keys({k: v for k, v in state.items() if not k.startswith(DROPPED)}, kept, any_depth=True)
    rows = {v.shape[0] for k, v in states["Lumina-tiny"].items() if any(n in k for n in QK_NORMS)}
    assert rows == {official["config"]["model_parallel_size"]}, rows


def _tiny(cls: type, folder_name: str, side: int) -> type:
    class Tiny(cls):
        __doc__ = (f"{cls.__name__} on a tiny random Chameleon ({folder_name}) and the VQGAN parity fixture's "
                   f"32-code decoder: {side} x {side} image tokens, {2 * side} x {2 * side} px images.")
        image_size = 16 * side  # the structure counts 16 px per token; the tiny VQGAN upsamples 2x

        folder = folder_name

        @classmethod
        def root(cls):
            return _files("tiny-chameleon", _write_chameleon)

        @classmethod
        def prompt_path(cls):
            return _files("tiny-chameleon", _write_chameleon) / "prompts.txt"

    Tiny.__name__ = Tiny.__qualname__ = f"Tiny{cls.__name__}"
    return Tiny


TinyLumina = _tiny(LuminaMGPT768, "Lumina-tiny", 2)  # 3 + 2 x 3 + 2 = 11 outputs
TinyLuminaHF = _tiny(LuminaMGPT768, "Chameleon-tiny", 2)  # the same weights, QK norms stored per head
TinyAnole = _tiny(Anole7B, "Chameleon-tiny", 2)  # 1 + 4 + 1 = 6 outputs


def tiny_chameleon_teacher(cls: type = TinyLumina, device="cpu"):
    """A tiny Chameleon teacher loaded through `LuminaMGPT768.load`."""
    return cls.load(f"tiny-{cls.__name__}", cache=None, device=torch.device(device))
