"""The LlamaGen text-to-image loader (teachers/pretrained/llamagen_t2i.py) on tiny files in the official formats: the
parity fixture's GPT (tests/fixtures/llamagen_t2i), the c2i fixture's VQ decoder, a tiny random T5 encoder with a
tiny tokenizer saved by transformers' `save_pretrained` as `flan-t5-xl`, and a prompt file."""
from __future__ import annotations

from pathlib import Path

import torch

from teachers.pretrained.llamagen_t2i import T5_FOLDER, LlamaGenT2I
from tests.fakes import FIXTURES, TinyLlamaGen, _files

T2I_PROMPTS = ("A photo of a cat", "a red bus on a street", "Two dogs playing in the snow.",
               "a bowl of fruit on a wooden table next to a window, in the morning light")


def _write_llamagen_t2i(folder: Path) -> None:
    """`t2i_tiny.pt` (the parity fixture's GPT under "model": 120 caption positions 16 wide, 32 codes), `vq_tiny.pt`
    (the c2i fixture's VQ decoder), `flan-t5-xl/` (a 1-layer T5, d_model 16, saved whole as FLAN-T5 is, and a
    Unigram tokenizer of T5's special tokens trained on the prompts, with `</s>` appended as T5's is) and
    `prompts.txt`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import T5Config, T5ForConditionalGeneration, T5TokenizerFast

    gpt = torch.load(FIXTURES / "llamagen_t2i" / "llamagen_t2i_tiny_parity.pt", weights_only=True)
    torch.save({"model": gpt["state_dict"]}, folder / "t2i_tiny.pt")
    vq = torch.load(FIXTURES / "llamagen" / "vq_tiny_parity.pt", weights_only=True)
    torch.save({"model": {k: v.float() if v.is_floating_point() else v for k, v in vq["state_dict"].items()}},
               folder / "vq_tiny.pt")
    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer, unigram.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    unigram.train_from_iterator([p.lower() for p in T2I_PROMPTS], trainers.UnigramTrainer(
        vocab_size=64, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False))
    tokenizer = T5TokenizerFast(tokenizer_object=unigram, extra_ids=0)
    config = T5Config(vocab_size=len(tokenizer), d_model=16, d_kv=4, d_ff=24, num_layers=1, num_heads=4,
                      feed_forward_proj="gated-gelu", pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        # the class google/flan-t5-xl was saved from (its decoder in the file), not the encoder the loader builds:
        # the loader must read the release's whole-model folder
        T5ForConditionalGeneration(config).save_pretrained(folder / T5_FOLDER)
    tokenizer.save_pretrained(folder / T5_FOLDER)
    (folder / "prompts.txt").write_text("\n".join(T2I_PROMPTS) + "\n")


class TinyLlamaGenT2I(LlamaGenT2I):
    """The text-to-image loader on tiny random-weight files (4 x 4 tokens of 32 codes, 8 x 8 images), written to
    disk and read back as the real files would be (`tiny-llamagen-t2i` in tests/plugins.py)."""

    seq_len = 16

    @classmethod
    def config(cls):
        from teachers.networks.llamagen import LlamaGenConfig

        return LlamaGenConfig(vocab_size=32, seq_len=cls.seq_len, n_layer=2, n_head=4, n_embd=32, ffn_hidden=96,
                              cond_len=120, caption_dim=16)

    vq_config = TinyLlamaGen.vq_config

    checkpoint, vq_file = "t2i_tiny.pt", "vq_tiny.pt"

    @classmethod
    def root(cls):
        return _files("tiny-llamagen-t2i", _write_llamagen_t2i)

    @classmethod
    def prompt_path(cls):
        return _files("tiny-llamagen-t2i", _write_llamagen_t2i) / "prompts.txt"


class TinyLlamaGenT2I4(TinyLlamaGenT2I):
    """The same files over 2 x 2 tokens (the GPT has no position table: RoPE on a 2 x 2 grid), small enough to
    enumerate every sequence top-k 2 allows."""

    seq_len = 4


def tiny_llamagen_t2i_teacher(cls=TinyLlamaGenT2I, device="cpu"):
    """A tiny text-to-image teacher, loaded through `LlamaGenT2I.load` (transformers' `from_pretrained` for T5)."""
    return cls.load("tiny-llamagen-t2i", cache=None, device=torch.device(device))
