"""Tiny fake teachers, one per family, small enough to enumerate every output exactly."""
from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from teachers.families import ar_token, continuous_ar, masked_ar
from teachers.pretrained.dit import OfficialDiT
from teachers.pretrained.emu3 import Emu3Gen
from teachers.pretrained.llamagen import LlamaGenGPTB256
from teachers.pretrained.mar import MARH
from teachers.pretrained.mdlm_owt import MDLMOWT, MDLMOWTPrompted
from teachers.pretrained.var import VARd16

# The checkpoints folder of a test whose teachers, metrics and methods read no user files (tiny and fake ones): a
# folder that does not exist, so anything read from it by mistake fails.
NO_CHECKPOINTS = Path(tempfile.gettempdir()) / "accelbench-tests-no-checkpoints"


@dataclass
class _TableState:
    rows: list  # the tokens of each sequence of the batch
    cfg: float
    ragged: bool = False  # rows keep their own lengths

    @property
    def length(self) -> int | torch.Tensor:
        return torch.tensor([len(row) for row in self.rows]) if self.ragged else len(self.rows[0])


class TableAR:
    """A discrete AR 'model' whose next-token logits are a random table indexed by the whole prefix.

    Every prefix gets its own distribution, so verification bugs that only a real prefix dependence exposes are not
    hidden. `extend` also records every prefix it was asked about, for KV-rollback checks. Sequences of a batch are
    looked up one by one, so rows keep their own lengths (a ragged state); an input past the sequence's end (a padded
    window) predicts nothing and gets zero logits. `codebook` is a fixed random unit vector per token (flow-matching
    methods map into it).
    """

    family: ClassVar = ar_token.FAMILY
    modality: ClassVar[str] = "image"
    supports_cfg: ClassVar[bool] = True
    ragged_cache: ClassVar[bool] = True

    def __init__(self, vocab=3, seq_len=4, grid=(2, 2), seed=0, sharpness=1.5):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.seq_len, self.grid = vocab, seq_len, grid
        n_prefixes = sum(vocab**k for k in range(seq_len))
        self._cond = sharpness * torch.randn(n_prefixes, vocab, generator=g)
        self._uncond = sharpness * torch.randn(n_prefixes, vocab, generator=g)
        self.codebook = torch.nn.functional.normalize(torch.randn(vocab, 4, generator=g), dim=-1)  # (V, 4)

    def _index(self, prefix) -> int:
        offset = sum(self.vocab_size**k for k in range(len(prefix)))
        return offset + sum(int(t) * self.vocab_size**i for i, t in enumerate(prefix))

    def _logits(self, prefix, cfg):
        i = self._index(prefix)
        c, u = self._cond[i], self._uncond[i]
        return c if cfg == 1.0 else u + cfg * (c - u)

    def conditions(self, n, generator):
        return torch.zeros(n, 1, dtype=torch.long, device=generator.device)

    def start(self, cond, *, cfg, ragged=False):
        state = _TableState([[] for _ in range(len(cond))], cfg, ragged)
        return state, self._logits([], cfg).expand(len(cond), -1)

    def extend(self, state, tokens):
        out = []
        for row, new in zip(state.rows, tokens.tolist()):
            steps = []
            for t in new:
                row.append(t)
                steps.append(self._logits(row, state.cfg) if len(row) < self.seq_len else torch.zeros(self.vocab_size))
            out.append(torch.stack(steps))
        return torch.stack(out)  # (B, L, V)

    def rollback(self, state, length):
        lengths = length.tolist() if torch.is_tensor(length) else [length] * len(state.rows)
        for row, n in zip(state.rows, lengths):
            del row[n:]

    def select(self, state, rows):
        state.rows = [list(state.rows[i]) for i in rows.tolist()]  # a row kept twice is two rows (SJD-PAC's paths)

    def decode(self, tokens):
        return tokens.float().view(len(tokens), 1, *self.grid) / max(1, self.vocab_size - 1)

    def exact_distribution(self, s: ar_token.SamplingConfig) -> dict[tuple, float]:
        """Probability of every sequence under the processed (CFG, temperature, top-k) sampling distribution."""
        out = {}
        for seq in itertools.product(range(self.vocab_size), repeat=self.seq_len):
            p = 1.0
            for i in range(self.seq_len):
                p *= float(ar_token.process(self._logits(list(seq[:i]), s.cfg), s)[seq[i]])
            out[seq] = p
        return out


def tiny_gpt_teacher(seed=0, vocab=16, grid=(3, 4), cond_len=2, device="cpu"):
    """An untrained raster transformer wrapped as an image AR teacher: real KV cache, CFG branches, no training."""
    from teachers.networks.gpt import GPT, GPTConfig
    from teachers.tiny.image_ar import ImageARRecipe, ImageARTeacher
    from teachers.data.patch_vq import PatchQuantizer

    class Tiny(ImageARTeacher):
        recipe = ImageARRecipe(dataset="digits", conditioning="class", image_size=grid[0] * 2, patch=2)

    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=vocab, cond_vocab=13, cond_len=cond_len, seq_len=grid[0] * grid[1], n_layer=2,
                    n_head=2, n_embd=32)
    model = GPT(cfg)
    for p in model.parameters():  # larger weights than the init, so the logits depend strongly on the prefix
        p.data.mul_(8.0)
    vq = PatchQuantizer(torch.rand(vocab, 4), patch=2, channels=1, image_size=grid[0] * 2)
    table = (torch.arange(10).view(10, 1, 1) + 3).expand(10, 1, cond_len).clone()
    teacher = Tiny("tiny", model.to(device), vq.to(device), table.to(device), {})
    teacher.grid = grid  # the quantizer is square; the raster of this fake is not, to catch row/col mix-ups
    return teacher


class RegisteredTinyGPT:
    """`tiny_gpt_teacher` on a 3 x 3 raster as a registry entry (a recipe key, `load` on a device), for the trials the
    GPU check runs through the runner."""

    family, modality, supports_cfg, ragged_cache = ar_token.FAMILY, "image", True, True

    @classmethod
    def key(cls):
        return "gpu-check-gpt-v1".ljust(20, "0")

    @classmethod
    def load(cls, name, *, cache, device):
        return tiny_gpt_teacher(grid=(3, 3), device=device)


@dataclass
class _ChainState:
    tokens: torch.Tensor  # (B, N, D) what each row has read
    length: torch.Tensor  # (B,)
    cond: torch.Tensor  # (B,)
    cfg: float


class LinearGaussianModel:
    """A continuous-token AR 'model' whose diffusion head is a linear-Gaussian chain (CSpD's analytic toy).

    z of position i is (the condition's offset + rho * x_{i-1}) per dimension, per CFG branch; the head's K steps are
    x_{k-1} = (1 - lam) x_k + lam * z + sigma_k * tau * eps_k with model-specific step stds sigma_k, so the token law
    depends on the prefix (AR(1) correlation rho) and the draft's Sigma factor differs from the target's.
    """

    def __init__(self, seq_len, dim, rho, offsets, uncond, lam, sigma_scale):
        self.seq_len, self.dim, self.rho = seq_len, dim, rho
        self.offsets, self.uncond, self.lam, self.sigma_scale = offsets, uncond, lam, sigma_scale

    def _z(self, state, prev):  # prev (B, L, D) -> (B, L, branches, D)
        c = self.offsets[state.cond][:, None, :] + self.rho * prev
        u = self.uncond + self.rho * prev
        return torch.stack([c, u], -2) if state.cfg != 1.0 else c[..., None, :]

    def start(self, cond, *, cfg):
        B = len(cond)
        state = _ChainState(torch.zeros(B, self.seq_len, self.dim), torch.zeros(B, dtype=torch.long), cond[:, 0], cfg)
        return state, self._z(state, torch.zeros(B, 1, self.dim))[:, 0]

    def extend(self, state, tokens):
        B, L, _ = tokens.shape
        pos = state.length[:, None] + torch.arange(L)
        state.tokens[torch.arange(B)[:, None], pos] = tokens
        state.length = state.length + L
        return self._z(state, tokens)

    def rollback(self, state, lengths):
        assert (lengths <= state.length).all() and (lengths >= 0).all()
        state.length = lengths.clone()

    def select(self, state, rows):
        state.tokens, state.length, state.cond = state.tokens[rows], state.length[rows], state.cond[rows]

    def sigmas(self, steps):
        return self.sigma_scale * torch.linspace(1.0, 0.3, steps)

    def denoise(self, z, x_T, eps, sampling, cfg=None):
        """cfg: the scale (or one per token, (M,)) when it is not `sampling.cfg` (the masked family's schedule)."""
        from teachers.networks.diffusion_head import HeadOutput

        w = sampling.cfg if cfg is None else (cfg[:, None] if isinstance(cfg, torch.Tensor) else cfg)
        target = z[:, 1] + w * (z[:, 0] - z[:, 1]) if z.shape[1] == 2 else z[:, 0]
        x, total, sig = x_T, torch.zeros(len(x_T)), self.sigmas(sampling.steps) * sampling.temperature
        for i in range(sampling.steps):
            mean, log_std = (1 - self.lam) * x + self.lam * target, sig[i].log().expand_as(x)
            last = i == sampling.steps - 1
            if not last:
                total = total + log_std.sum(-1)
            x = mean + sig[i] * eps[:, i] if (not last or sampling.final_noise) else mean
        return HeadOutput(x, mean, log_std, total)


class LinearGaussianAR:
    """A continuous-AR teacher of two `LinearGaussianModel`s: target and a deliberately different draft."""

    family: ClassVar = continuous_ar.FAMILY
    modality: ClassVar[str] = "image"

    def __init__(self, seq_len=3, dim=1, grid=(1, 3), draft_shift=0.3, draft_sigma=1.3, same=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.seq_len, self.token_dim, self.grid = seq_len, dim, grid
        offsets, uncond = torch.randn(3, dim, generator=g), torch.zeros(dim)
        self.target = LinearGaussianModel(seq_len, dim, 0.8, offsets, uncond, 0.5, 0.5)
        self.draft = self.target if same else LinearGaussianModel(seq_len, dim, 0.6, offsets + draft_shift, uncond,
                                                                  0.5, 0.5 * draft_sigma)

    def conditions(self, n, generator):
        return torch.randint(3, (n, 1), generator=generator, device=generator.device)

    def decode(self, tokens):
        return torch.sigmoid(tokens.flatten(1)).view(len(tokens), 1, 1, -1)

    def captions(self, cond):
        return [f"class {int(c)}" for c in cond[:, 0]]


class LinearGaussianMaskedModel:
    """A masked-family 'model' on `LinearGaussianModel`'s chain: z of every position is the condition's offset + rho *
    the mean of the known tokens (0 when none), per CFG branch, so a token's law depends on every known one."""

    def __init__(self, chain: LinearGaussianModel):
        self.chain = chain

    def condition(self, tokens, known, cond, *, guided, known_count=None):
        B, N, D = tokens.shape
        k = known[..., None].float()
        mean = self.chain.rho * (tokens * k).sum(1) / k.sum(1).clamp(min=1)  # (B, D)
        c, u = self.chain.offsets[cond[:, 0]] + mean, self.chain.uncond + mean
        z = torch.stack([c, u], 1) if guided else c[:, None]  # (B, branches, D)
        return z[:, None].expand(B, N, *z.shape[1:])

    def denoise(self, z, x_T, eps, sampling, cfg):
        return self.chain.denoise(z, x_T, eps, sampling, cfg)


class LinearGaussianMasked:
    """A masked-family teacher of two `LinearGaussianMaskedModel`s: target and a deliberately different draft."""

    family: ClassVar = masked_ar.FAMILY
    modality: ClassVar[str] = "image"

    def __init__(self, seq_len=3, dim=1, draft_shift=0.3, draft_sigma=1.3, same=False, seed=0):
        chains = LinearGaussianAR(seq_len, dim, (1, seq_len), draft_shift, draft_sigma, same, seed)
        self.seq_len, self.token_dim, self.grid = seq_len, dim, (1, seq_len)
        self.target = LinearGaussianMaskedModel(chains.target)
        self.draft = self.target if same else LinearGaussianMaskedModel(chains.draft)
        self.conditions, self.decode, self.captions = chains.conditions, chains.decode, chains.captions


def tiny_masked_mar_teacher(seed=0, same=False, device="cpu"):
    """An untrained MAR pair (the real network: bidirectional encoder-decoder with a ragged known set, diffusion head,
    CFG branches) on 8x8 images of 2x2 patches (16 tokens); `same=True` makes the draft the target itself."""
    from teachers.tiny.image_masked_mar import MaskedMARRecipe, MaskedMARTeacher, ModelSize

    size = ModelSize(width=16, depth=1, heads=2, head_width=16, head_depth=1)

    class Tiny(MaskedMARTeacher):
        recipe = MaskedMARRecipe(image_size=8, target=size, draft=size, buffer_size=2)

    torch.manual_seed(seed)
    target, draft = Tiny._model(size, 10), Tiny._model(size, 10)
    for m in (target, draft):
        for p in m.parameters():  # zero-initialised parts (positions, the head's output) must matter too
            p.data.add_(0.3 * torch.randn_like(p))
    return Tiny("tiny-masked-mar", target.to(device), (target if same else draft).to(device), {})


def tiny_mar_teacher(seed=0, same=False, device="cpu"):
    """An untrained MAR-style teacher (real ragged KV cache, diffusion head, CFG branches) on 4x4 images of 2x2
    patches; `same=True` makes the draft the target itself."""
    from teachers.tiny.image_mar import ImageMARRecipe, ImageMARTeacher, ModelSize

    size = ModelSize(n_layer=2, n_head=2, n_embd=16, head_width=16, head_depth=1)

    class Tiny(ImageMARTeacher):
        recipe = ImageMARRecipe(dataset="digits", image_size=4, patch=2, target=size, draft=size)

    torch.manual_seed(seed)
    target, draft = Tiny._model(size, 10), Tiny._model(size, 10)
    for m in (target, draft):
        for p in m.parameters():  # the head's output starts at zero; give every layer weight
            p.data.add_(0.3 * torch.randn_like(p))
    target, draft = target.to(device), draft.to(device)
    return Tiny("tiny-mar", target, target if same else draft, {})


def tiny_dit_teacher(seed=0, device="cpu"):
    """An untrained class-conditional DiT teacher (8x8 images, 4 tokens), adaLN weights made non-zero so that every
    block, the time and the class matter."""
    from teachers.networks.dit import DiT, DiTConfig
    from teachers.tiny.image_dit import ImageDiTRecipe, ImageDiTTeacher

    class Tiny(ImageDiTTeacher):
        recipe = ImageDiTRecipe(dataset="digits", image_size=8, patch=4, hidden=16, depth=3, heads=2)

    torch.manual_seed(seed)
    model = DiT(DiTConfig(image_size=8, patch=4, hidden=16, depth=3, heads=2))
    for p in model.parameters():
        p.data.add_(0.2 * torch.randn_like(p))
    return Tiny("tiny-dit", model.to(device), {})


_FILES: dict[str, object] = {}  # temporary folders that live as long as the test process
FIXTURES = Path(__file__).parent / "fixtures"


def assert_release_keys(written: dict, official: dict, *, dims: dict[int, int] | None = None,
                        any_depth: bool = False) -> None:
    """A fake release file's state dict `written` against `official`, the state dict (or keys and shapes) of what
    the release's own code writes (a fixture of tests/fixtures/, its MAKING.md says how it was made), never what our
    class writes: a key our class has and the release lacks, or the other way round, fails the test that writes the
    fake. The same names, and the same shapes with the official fixture's sizes that differ here mapped by `dims`
    (its vocabulary, {51: 301}); names only where `dims` is None (the configurations differ in more). `any_depth`:
    names compared without their block indices, shapes not (the official key set is at another depth and width)."""
    import re

    def names(keys):
        return {re.sub(r"(?<=\.)\d+(?=\.)", "*", k) for k in keys} if any_depth else set(keys)

    extra, missing = sorted(names(written) - names(official)), sorted(names(official) - names(written))
    assert not extra and not missing, f"keys the release lacks {extra[:5]}, release keys missing {missing[:5]}"
    if dims is not None and not any_depth:
        def shape(v) -> list[int]:  # a tensor's, or a fixture's listed shape
            return list(getattr(v, "shape", v))

        want = {k: [dims.get(d, d) for d in shape(v)] for k, v in official.items()}
        differ = {k: (shape(written[k]), want[k]) for k in want if shape(written[k]) != want[k]}
        assert not differ, f"shapes (written, official) differ: {dict(list(differ.items())[:5])}"


def _files(name: str, write) -> Path:
    """A temporary folder `name`, filled once per test process by `write(folder)`."""
    if name not in _FILES:
        _FILES[name] = tempfile.TemporaryDirectory(prefix=f"{name}-")
        write(Path(_FILES[name].name))
    return Path(_FILES[name].name)


def _write_official_dit(folder: Path) -> None:
    """The parity fixture's DiT state dict (official key names, learned sigma, 16 latent tokens of 4 channels, 10
    classes) and a one-level SD-style VAE (diffusers `AutoencoderKL`, random weights)."""
    from diffusers import AutoencoderKL

    torch.save(torch.load(FIXTURES / "dit" / "dit_tiny_parity.pt", weights_only=True)["state_dict"],
               folder / "DiT-tiny.pt")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        AutoencoderKL(block_out_channels=(8,), layers_per_block=1, latent_channels=4, norm_num_groups=4,
                      sample_size=8).save_pretrained(folder / "vae")


class TinyOfficialDiT(OfficialDiT):
    """The loader of the official DiT checkpoints on tiny random-weight files, written to disk and read back as the
    real files would be (`tiny-official-dit` in tests/plugins.py)."""

    @classmethod
    def config(cls):
        from teachers.networks.dit import DiTConfig

        return DiTConfig(image_size=8, channels=4, patch=2, n_classes=10, hidden=32, depth=2, heads=4,
                         learn_sigma=True, pos_layout="col-row")

    checkpoint, vae_folder = "DiT-tiny.pt", "vae"

    @classmethod
    def root(cls):
        return _files("tiny-official-dit", _write_official_dit)


def tiny_official_dit_teacher(device="cpu"):
    """`TinyOfficialDiT`, loaded through `OfficialDiT.load`."""
    return TinyOfficialDiT.load("tiny-official-dit", cache=None, device=torch.device(device))


def _write_llamagen(folder: Path) -> None:
    """The parity fixtures' LlamaGen GPT (under "model", as released; 10 classes, 32 codes, 4 x 4 tokens) and VQ
    decoder (32 x 8 codebook, one upsampling: 8 x 8 images)."""
    gpt = torch.load(FIXTURES / "llamagen" / "llamagen_tiny_parity.pt", weights_only=True)
    vq = torch.load(FIXTURES / "llamagen" / "vq_tiny_parity.pt", weights_only=True)
    torch.save({"model": gpt["state_dict"], "args": None}, folder / "c2i_tiny.pt")
    torch.save({"model": {k: v.float() if v.is_floating_point() else v for k, v in vq["state_dict"].items()}},
               folder / "vq_tiny.pt")


class TinyLlamaGen(LlamaGenGPTB256):
    """The LlamaGen loader on tiny random-weight files, written to disk and read back as the real files would be
    (`tiny-llamagen` in tests/plugins.py)."""

    @classmethod
    def config(cls):
        from teachers.networks.llamagen import LlamaGenConfig

        return LlamaGenConfig(vocab_size=32, num_classes=10, seq_len=16, n_layer=2, n_head=4, n_embd=32,
                              ffn_hidden=96)

    @classmethod
    def vq_config(cls):
        from teachers.networks.vq16 import VQDecoderConfig

        return VQDecoderConfig(codebook_size=32, embed_dim=8, z_channels=32, ch=32, ch_mult=(1, 1), num_res_blocks=1)

    checkpoint, vq_file = "c2i_tiny.pt", "vq_tiny.pt"

    @classmethod
    def root(cls):
        return _files("tiny-llamagen", _write_llamagen)


def tiny_llamagen_teacher(device="cpu"):
    """`TinyLlamaGen`, loaded through `LlamaGenC2I.load`."""
    return TinyLlamaGen.load("tiny-llamagen", cache=None, device=torch.device(device))



EMU3_SPECIALS = {"pad": "<|endoftext|>", "eol": "<|extra_200|>", "eof": "<|extra_201|>", "bos": "<|extra_203|>",
                 "eos": "<|extra_204|>", "wrapper": "<|image token|>", "boi": "<|image start|>",
                 "eoi": "<|image end|>", "image": "<image>"}  # Emu3's special-token strings (docs/checkpoints.md)
EMU3_PROMPTS = ("a photo of a cat", "a red bus on a street", "two dogs playing in the snow", "a bowl of fruit")


def _write_emu3(folder: Path) -> None:
    """A tiny random Emu3 in the Hugging Face format (`save_pretrained`): the text config of transformers' own Emu3
    tests (hidden 32, 2 layers, intermediate 37), a VQ-VAE of 20 codes upsampling 4x, a byte-level BPE tokenizer with
    Emu3's special tokens (300 ids: the 20 visual tokens among them), the processor; and a prompt file."""
    import json

    from safetensors.torch import load_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (Emu3Config, Emu3ForConditionalGeneration, Emu3ImageProcessor, Emu3Processor,
                              Emu3TextConfig, PreTrainedTokenizerFast)

    visual = [f"<|visual token {k:06d}|>" for k in range(20)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(list(EMU3_PROMPTS) + ["lowres, bad anatomy, 0123456789*"], trainers.BpeTrainer(
        vocab_size=300, special_tokens=list(EMU3_SPECIALS.values()) + visual, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    e = EMU3_SPECIALS
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=e["bos"], eos_token=e["eos"], pad_token=e["pad"],
        extra_special_tokens={"image_token": e["image"], "boi_token": e["boi"], "eoi_token": e["eoi"],
                              "image_wrapper_token": e["wrapper"], "eof_token": e["eof"]})
    text = Emu3TextConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=2, intermediate_size=37, max_position_embeddings=128,
                          pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id)
    vq = {"codebook_size": 20, "temporal_downsample_factor": 1, "base_channels": 32, "channel_multiplier": [1, 2, 1],
          "hidden_size": 32, "attn_resolutions": []}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Emu3ForConditionalGeneration(Emu3Config(text_config=text, vq_config=vq,
                                                        vocabulary_map=tokenizer.get_vocab()))
    model.save_pretrained(folder / "Emu3-tiny")
    Emu3Processor(Emu3ImageProcessor(), tokenizer).save_pretrained(folder / "Emu3-tiny")
    # written by transformers 5, read back as the release's folder: held to the keys and shapes that the release's
    # writer (transformers 4.48's conversion script, `save_pretrained`) gives at this size (tests/fixtures/emu3)
    official = json.loads((FIXTURES / "emu3" / "Emu3-tiny.keys.json").read_text())["keys"]
    assert_release_keys(load_file(folder / "Emu3-tiny" / "model.safetensors"), official, dims={})
    (folder / "prompts.txt").write_text("\n".join(EMU3_PROMPTS) + "\n")


class TinyEmu3(Emu3Gen):
    """The Emu3 teacher on a tiny random model saved in the Hugging Face format: 2 x 3 visual tokens (ratio 3:2),
    11 outputs with the EOL, EOF, EOI and EOS tokens; 8 x 12 images (`tiny-emu3` in tests/plugins.py)."""

    ratio, image_area = "3:2", 384  # Emu3Processor.calculate_generate_size("3:2", 384, 8) = (2, 3)

    folder = "Emu3-tiny"

    @classmethod
    def root(cls):
        return _files("tiny-emu3", _write_emu3)

    @classmethod
    def prompt_path(cls):
        return _files("tiny-emu3", _write_emu3) / "prompts.txt"


def tiny_emu3_teacher(device="cpu"):
    """`TinyEmu3`, loaded through `Emu3Gen.load` (transformers' `from_pretrained`)."""
    return TinyEmu3.load("tiny-emu3", cache=None, device=torch.device(device))



def refused_by_the_cli(capture, *args: str) -> str:
    """The CLI's exit code 2 and its one line on stderr (`capture`: pytest's capsys or capfd)."""
    import cli

    assert cli.main(list(args)) == 2
    err = capture.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("accelbench: error: ") and "Traceback" not in err, err
    return err


def listed_entries(out: str) -> dict[str, str]:
    """`accelbench list`'s output as {name: its entry's text on one line} (an entry wraps over several lines; a
    method's knobs line is the end of its entry)."""
    entries: dict[str, str] = {}
    name = None
    for line in out.splitlines():
        if line.startswith("  ") and not line[2].isspace():
            name = line.split()[0]
            entries[name] = ""
        if name is not None and line.startswith("  "):
            entries[name] = f"{entries[name]} {line.strip()}".strip()
    return entries


def ar_methods_through_the_cli(teacher: str, tmp_path: Path, sampling: list[str], *, n_samples: int = 2,
                               batch_size: int = 1, init: str = "repeat-above") -> tuple[list, list[str]]:
    """`ar`, `jacobi` and `sjd` (window 4) on `teacher` by the CLI into a fresh MLflow store, then a report of them:
    returns the runs and the CLI arguments they shared (a caller adds its own refusals to them)."""
    from mlflow.tracking import MlflowClient

    import cli

    store = f"sqlite:///{tmp_path}/mlflow.db"
    common = ["--teacher", teacher, "--n-samples", str(n_samples), "--batch-size", str(batch_size),
              "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--experiment", "cli", "--warmup", "0",
              "--no-progress", *(a for p in sampling for a in ("--param", p))]
    for method, params in {"ar": [], "jacobi": ["window=4"], "sjd": ["window=4", f"init={init}"]}.items():
        assert cli.main(["run", "--method", method, *common, *(a for p in params for a in ("--param", p))]) == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("cli").experiment_id])
    assert sorted(r.data.params["method"] for r in runs) == ["ar", "jacobi", "sjd"]
    assert cli.main(["report", "--tracking-uri", store, "--experiment", "cli", "--out", str(tmp_path / "r")]) == 0
    assert f"## {teacher}" in (tmp_path / "r" / "REPORT.md").read_text()
    return runs, common


N_CLIP_MERGES = 500  # the first BPE merges of CLIP's own vocabulary: a valid CLIP tokenizer of ~1000 tokens


def write_tiny_clip(folder: Path, seed: int = 4) -> Path:
    """A tiny random transformers CLIPModel (32-wide towers, one layer, 32x32 images), its CLIPProcessor with a CLIP
    tokenizer of open_clip's first merges, save_pretrained'd into `folder` (what `clip@hf:<folder>` reads). Seed 4
    gives a model whose mean cosine on tests/test_metrics_clip_hf.py's samples is positive (the clamp leaves it)."""
    import gzip

    import open_clip
    from open_clip.tokenizer import bytes_to_unicode
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    bpe = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    lines = gzip.open(bpe, "rt", encoding="utf-8").read().split("\n")[1 : 1 + N_CLIP_MERGES]
    merges = [tuple(line.split()) for line in lines]
    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    tok = CLIPTokenizer(vocab={v: i for i, v in enumerate(vocab)}, merges=merges)
    common = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2)
    config = CLIPConfig(text_config=dict(vocab_size=len(tok), max_position_embeddings=77, bos_token_id=tok.bos_token_id,
                                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **common),
                        vision_config=dict(image_size=32, patch_size=8, **common), projection_dim=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(config)
    model.save_pretrained(folder)
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
                  tokenizer=tok).save_pretrained(folder)
    return folder


def write_sdtt_checkpoints(folder: Path) -> None:
    """The SDTT paper's files in their official formats and names, tiny and random: `gpt2/` (a byte-level BPE
    tokenizer of 300 tokens with GPT-2's one special token, saved as GPT-2's fast tokenizer, and a 2-layer GPT-2 of 128
    positions), `mdlm-owt/` (the release's config.json and model.safetensors with `backbone.` keys: a 2-block
    MDLM DiT over 32 tokens), and `webtext.{train,test}.jsonl` (WordNet glosses, 20 to a document)."""
    import json

    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from teachers.data.text import load_documents
    from teachers.networks.mdlm_dit import MDLMDiT, MDLMDiTConfig

    glosses = load_documents("wordnet")
    docs = [" ".join(glosses[i : i + 20]) for i in range(0, 4000, 20)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok = GPT2TokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                            unk_token="<|endoftext|>")
    V = len(tok)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=128, n_embd=32, n_layer=2, n_head=2,
                                          bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id))
        cfg = MDLMDiTConfig(vocab_size=V + 1, hidden_size=32, cond_dim=16, length=32, n_blocks=2, n_heads=4)
        mdlm = MDLMDiT(cfg)
        for p in mdlm.parameters():  # the official init zeroes adaLN and the output layer
            torch.nn.init.normal_(p, std=0.1)
    gpt2.save_pretrained(folder / "gpt2")
    tok.save_pretrained(folder / "gpt2")
    (folder / "mdlm-owt").mkdir()
    state = {f"backbone.{k}": v.contiguous() for k, v in mdlm.state_dict().items()}
    # the official DIT's keys (tests/fixtures/mdlm, the same size but its 51 tokens) under the HF wrapper's
    # `backbone.`, which no official fixture lists (docs/checkpoints.md, 'MDLM-OWT': third-party evidence)
    official = torch.load(FIXTURES / "mdlm" / "mdlm_tiny_parity.pt", weights_only=True)
    assert_release_keys(state, {f"backbone.{k}": v for k, v in official["state_dict"].items()},
                        dims={official["vocab_size"]: V + 1})
    save_file(state, folder / "mdlm-owt" / "model.safetensors")
    (folder / "mdlm-owt" / "config.json").write_text(json.dumps({
        "model_type": "mdlm", "hidden_dim": 32, "cond_dim": 16, "model_length": 32, "n_blocks": 2, "n_heads": 4,
        "dropout": 0.1, "vocab_size": V + 1, "time_conditioning": False}))
    for split, part in (("train", docs[:150]), ("test", docs[150:])):
        (folder / f"webtext.{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in part))


def write_sdtt_student(folder: Path, revision: str, *, distill_mode: str = "kl-bwd", seed: int = 1, **model) -> Path:
    """A released SDTT student for the tiny `mdlm-owt` of `write_sdtt_checkpoints` in `folder`: `folder/revision/`
    with config.json in the release's layout (the official run's config of tests/fixtures/sdtt, its `model` sized
    like the teacher, or by `model`) and random weights under exactly the keys of the official fixture's
    model.safetensors (written by the release's `push_to_hub` path), asserted: their shapes too, but for its
    51-token vocabulary, where `model` resizes nothing."""
    import json

    from safetensors.torch import load_file, save_file

    from teachers.networks.mdlm_dit import MDLMDiT, MDLMDiTConfig

    teacher = json.loads((folder / "mdlm-owt" / "config.json").read_text())
    config = json.loads((Path(__file__).parent / "fixtures" / "sdtt" / "baselines_kld_step_70000" /
                         "config.json").read_text())
    config["model"].update({"hidden_size": teacher["hidden_dim"], "cond_dim": teacher["cond_dim"],
                            "length": teacher["model_length"], "n_blocks": teacher["n_blocks"],
                            "n_heads": teacher["n_heads"], **model})
    config["parameterization"]["distill_mode"] = distill_mode
    m = config["model"]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = MDLMDiT(MDLMDiTConfig(vocab_size=teacher["vocab_size"], hidden_size=m["hidden_size"],
                                    cond_dim=m["cond_dim"], length=m["length"], n_blocks=m["n_blocks"],
                                    n_heads=m["n_heads"]))
        for p in net.parameters():
            torch.nn.init.normal_(p, std=0.1)
    state = {f"backbone.{k}": v.contiguous() for k, v in net.state_dict().items()}
    fixture = FIXTURES / "sdtt"
    vocab = torch.load(fixture / "sdtt_student_parity.pt", weights_only=True)["vocab_size"]
    assert_release_keys(state, load_file(fixture / "baselines_kld_step_70000" / "model.safetensors"),
                        dims=None if model else {vocab: teacher["vocab_size"]})
    (folder / revision).mkdir(parents=True)
    save_file(state, folder / revision / "model.safetensors")
    (folder / revision / "config.json").write_text(json.dumps(config, sort_keys=True, indent=2))
    return folder / revision


def write_release(path: Path, state: dict, tree: str = "var") -> None:
    """A DD student file as the release has it, with its EMA weights and its raw weights (made different, so a loader
    that read the raw ones would fail): VAR's trainer state, LlamaGen's training checkpoint."""
    raw = {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}
    blob = ({"trainer": {"ema_parameters": state, "var_wo_ddp": raw, "config": {"patch_nums": (1, 2, 3, 4)}}}
            if tree == "var" else {"ema": state, "model": raw, "steps": 0})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(blob, path)


def write_dd_student(path: Path, teacher: str) -> None:
    """A released DD student for the tiny teacher class `teacher` ("TinyVAR" or "TinyLlamaGen"), random weights (every
    part of the network in play: several are zero at init), under exactly the keys the official class writes
    (tests/fixtures/dd: `DD_Model`'s persistent buffers `lvl_1L` and `attn_bias_for_masking` included, which our
    class computes and does not save), asserted: names only for VAR (the fixture is 32 wide, `TinyVAR` 64), names
    and shapes for LlamaGen (the fixture's size). Our class's own state dict once carried a `codebook` key no release
    has, and the tests that wrote it could not see every real file refused."""
    from core.rng import seeded
    from methods.dd_released import ReleasedLlamaGenDD, ReleasedVARDD

    var = teacher == "TinyVAR"
    t = tiny_var_teacher() if var else tiny_llamagen_teacher()
    with seeded(0):
        net = (ReleasedVARDD if var else ReleasedLlamaGenDD)(t.network, t.codebook)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    state = net.state_dict()
    if var:
        state.update(lvl_1L=net.lvl_1L, attn_bias_for_masking=net.attn_bias)
    official = FIXTURES / "dd" / ("var_dd_tiny_parity.pt" if var else "llamagen_dd_tiny_parity.pt")
    assert_release_keys(state, torch.load(official, weights_only=True)["state_dict"], dims=None if var else {})
    write_release(path, state, "var" if var else "llamagen")


class TinyMDLMOWT(MDLMOWT):
    """`mdlm-owt` on the tiny files of `write_sdtt_checkpoints` (a folder of this test process)."""

    @classmethod
    def root(cls):
        return _files("tiny-sdtt", write_sdtt_checkpoints)


class TinyMDLMOWTPrompted(MDLMOWTPrompted):
    """`mdlm-owt-prompted` on the tiny files of `write_sdtt_checkpoints`."""

    root = TinyMDLMOWT.root


def tiny_gpt2_folder_teacher(device="cpu"):
    """The teacher `hf:<folder>` on the tiny GPT-2 of `write_sdtt_checkpoints`: unconditional, from BOS."""
    from teachers.pretrained.hf_folder import teacher_class

    name = f"hf:{_files('tiny-sdtt', write_sdtt_checkpoints) / 'gpt2'}"
    return teacher_class(name).at(NO_CHECKPOINTS).load(name, cache=None, device=torch.device(device))  # a path


def tiny_mdlm_owt_teacher(device="cpu"):
    """`TinyMDLMOWT`, loaded through `MDLMOWT.load` (safetensors with `backbone.` keys, GPT-2's tokenizer)."""
    return TinyMDLMOWT.load("tiny-mdlm-owt", cache=None, device=torch.device(device))



def _write_var(folder: Path) -> None:
    """The parity fixture's VAR (depth 2, width 64, scales 1-4, 64 codes, 10 classes) and VQ-VAE (decoder with one
    upsampling: 8 x 8 images) as raw state dicts, as VAR's files are; the VQ-VAE's with an encoder tensor, as the real
    file has (the loader drops it)."""
    f = torch.load(FIXTURES / "var" / "var_tiny_parity.pt", weights_only=True)
    torch.save(f["var_state_dict"], folder / "var_tiny.pth")
    torch.save({**f["vae_state_dict"], "encoder.conv_in.weight": torch.zeros(1)}, folder / "vae_tiny.pth")


def _write_mar(folder: Path) -> None:
    """The parity fixture's MAR pair and KL-16 decoder as MAR's files are: training checkpoints with the EMA weights
    under `model_ema` (and an `args` Namespace, trap T1) in `mar/<model>/checkpoint-last.pth`, the VAE's state under
    `model` in `vae/kl16.ckpt`, with an encoder tensor (the loader drops it)."""
    import argparse

    f = torch.load(FIXTURES / "mar" / "mar_tiny_parity.pt", weights_only=True)
    for model, which in (("mar_huge", "target"), ("mar_base", "draft")):
        (folder / "mar" / model).mkdir(parents=True)
        state = f[f"{which}_state"]
        torch.save({"model": {k: v + 1 for k, v in state.items()}, "model_ema": state, "epoch": 0,
                    "args": argparse.Namespace(model=model)}, folder / "mar" / model / "checkpoint-last.pth")
    (folder / "vae").mkdir()
    vae = torch.load(FIXTURES / "mar" / "kl16_tiny_parity.pt", weights_only=True)["state"]
    torch.save({"model": {**vae, "encoder.conv_in.weight": torch.zeros(1)}}, folder / "vae" / "kl16.ckpt")


class TinyOfficialMAR(MARH):
    """The MAR loader on tiny random-weight files in the official format (the parity fixture's pair: 16 tokens of 4
    dims, widths 32 and 16; a KL-16 decoder with one upsampling), written to disk and read back (`tiny-mar-official`
    in tests/plugins.py)."""

    @classmethod
    def config(cls, model, head_width, head_depth):
        from teachers.networks.mar import MARConfig

        width, depth = (32, 2) if model == "mar_huge" else (16, 1)
        return MARConfig(seq_len=16, token_dim=4, encoder_width=width, encoder_depth=depth, encoder_heads=2,
                         decoder_width=width, decoder_depth=depth, decoder_heads=2, buffer_size=4,
                         head_width=head_width, head_depth=head_depth, norm_eps=1e-5)

    @classmethod
    def vae_config(cls):
        from teachers.networks.kl16 import KL16Config

        return KL16Config(embed_dim=4, ch=32, ch_mult=(1, 2))

    @classmethod
    def root(cls):
        return _files("tiny-mar-official", _write_mar)


def tiny_official_mar_teacher(device="cpu"):
    """`TinyOfficialMAR`, loaded through `MARH.load`."""
    return TinyOfficialMAR.load("tiny-mar-official", cache=None, device=torch.device(device))


class TinyVAR(VARd16):
    """The VAR loader on tiny random-weight files, written to disk and read back as the real files would be
    (`tiny-var` in tests/plugins.py)."""

    @classmethod
    def config(cls):
        from teachers.networks.var import VARConfig

        return VARConfig(depth=2, num_classes=10, vocab_size=64, Cvae=8, patch_nums=(1, 2, 3, 4), embed_dim=64,
                         num_heads=2)

    @classmethod
    def vq_config(cls):
        from teachers.networks.msvq import MSVQConfig

        return MSVQConfig(vocab_size=64, Cvae=8, ch=32, ch_mult=(1, 2), num_res_blocks=1, patch_nums=(1, 2, 3, 4))

    vae_file = "vae_tiny.pth"

    @classmethod
    def root(cls):
        return _files("tiny-var", _write_var)

    @classmethod
    def local_files(cls):
        return "var_tiny.pth", cls.vae_file


def tiny_var_teacher(device="cpu"):
    """`TinyVAR`, loaded through `VARC2I.load`."""
    return TinyVAR.load("tiny-var", cache=None, device=torch.device(device))


class TinyCoDeDrafter(VARd16):
    """The VAR loader on the CoDe fixture's drafter (`tests/fixtures/code/MAKING.md`: CoDe's own classes on tiny
    random weights, its files as the release writes them); `tiny-code-drafter` in tests/plugins.py."""

    depth_width_heads = (2, 64, 2)
    vae_file = "vae_tiny.pth"

    @classmethod
    def config(cls):
        from teachers.networks.var import VARConfig

        depth, width, heads = cls.depth_width_heads
        return VARConfig(depth=depth, num_classes=10, vocab_size=64, Cvae=8, patch_nums=(1, 2, 3, 4),
                         embed_dim=width, num_heads=heads)

    @classmethod
    def vq_config(cls):
        from teachers.networks.msvq import MSVQConfig

        return MSVQConfig(vocab_size=64, Cvae=8, ch=32, ch_mult=(1,), num_res_blocks=0, patch_nums=(1, 2, 3, 4))

    @classmethod
    def root(cls):
        return FIXTURES / "code"

    @classmethod
    def local_files(cls):
        return "var_tiny.pth", cls.vae_file


class TinyCoDeRefiner(TinyCoDeDrafter):
    """The CoDe fixture's refiner: one block 32 wide, the drafter's VQ-VAE; `tiny-code-refiner`."""

    depth_width_heads = (1, 32, 2)

    @classmethod
    def local_files(cls):
        return "var_tiny_small.pth", cls.vae_file


class CharTokenizer:
    """Ids 0..V-2 are the letters a, b, c, ...; id V-1 is EOS, decoded as a newline."""

    def batch_decode(self, ids, skip_special_tokens=True):  # a Hugging Face tokenizer's method
        return self.decode(ids)

    def __init__(self, vocab_size: int):
        self.vocab_size, self.eos_id = vocab_size, vocab_size - 1

    def encode(self, texts):
        return [[self.eos_id if c == "\n" else ord(c) - ord("a") for c in t if c == "\n" or c.isalpha()]
                for t in texts]

    def decode(self, ids):
        ids = ids.tolist() if torch.is_tensor(ids) else ids
        return ["".join("\n" if i == self.eos_id else chr(ord("a") + i) for i in row).strip() for row in ids]


def markov_chunks(vocab: int, seq_len: int, n: int, seed: int = 0) -> torch.Tensor:
    """(n, seq_len) sequences of a sharp random first-order Markov chain: data with structure an MDLM can learn."""
    g = torch.Generator().manual_seed(seed)
    trans = torch.softmax(3 * torch.randn(vocab, vocab, generator=g), -1)  # (V, V)
    x = torch.empty(n, seq_len, dtype=torch.long)
    x[:, 0] = torch.randint(vocab, (n,), generator=g)
    for i in range(1, seq_len):
        x[:, i] = torch.multinomial(trans[x[:, i - 1]], 1, generator=g).squeeze(-1)
    return x


def _text_teacher(base, model, vocab, seq_len, chunks, name, device):
    from core.cache import config_key
    from teachers.data.text import TextDataRecipe
    from teachers.tiny.text_lm import TextLMRecipe

    class Tiny(base):
        recipe = TextLMRecipe(data=TextDataRecipe(seq_len=seq_len), n_layer=1, n_head=2, n_embd=32)  # data unused
        companion_lm = "wordnet-gpt"

        @classmethod
        def key(cls):  # no corpus behind a fake
            return config_key(name, vocab, seq_len)

        def training_chunks(self, cache):
            return chunks

    chunks = chunks.to(device)
    return Tiny(name, model.to(device), CharTokenizer(vocab), chunks[:16], {})


def tiny_mdlm_teacher(seed=0, vocab=8, seq_len=8, train_steps=0, device="cpu"):
    """An MDLM teacher (real denoiser, SUBS, sampler) over a Markov chain of `vocab` letters; `train_steps` > 0
    trains it on the chain first (a second per 100 steps), so that distillation has something to match."""
    from core.training import optimizer_step, warmup_cosine
    from teachers.families import masked_diffusion as md
    from teachers.networks.mdlm import MDLMNet, MDLMNetConfig
    from teachers.tiny.text_mdlm import TextMDLMTeacher

    torch.manual_seed(seed)
    chunks = markov_chunks(vocab, seq_len, 512, seed)
    model = MDLMNet(MDLMNetConfig(vocab, seq_len, n_layer=2, n_head=2, n_embd=32, dropout=0.0))
    if train_steps:
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        sched = warmup_cosine(opt, train_steps)
        for _ in range(train_steps):
            x = chunks[torch.randint(len(chunks), (64,), generator=g)]
            t = md.antithetic_times(64, g)
            z = md.corrupt(x, t, vocab, g)
            loss = md.nelbo(model(z), x, z, t, vocab).mean()
            optimizer_step(loss, opt, sched, model.parameters())
    return _text_teacher(TextMDLMTeacher, model, vocab, seq_len, chunks, "tiny-mdlm", device)


def tiny_text_gpt_teacher(seed=0, vocab=8, seq_len=8, device="cpu"):
    """An untrained causal LM teacher (the real GPT with its KV cache and BOS condition) over `vocab` letters."""
    from teachers.networks.gpt import GPT, GPTConfig
    from teachers.tiny.text_gpt import TextGPTTeacher

    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab, 1, 1, seq_len, n_layer=2, n_head=2, n_embd=32))
    for p in model.parameters():  # larger weights than the init, so the logits depend on the prefix (x3: peaked, not
        p.data.mul_(3.0)  # one-hot: 59 of the 256 4-token sequences keep mass under top_p 0.9)
    return _text_teacher(TextGPTTeacher, model, vocab, seq_len, markov_chunks(vocab, seq_len, 64, seed), "tiny-gpt",
                         device)


def tiny_hf_lm_teacher(seed=0, vocab=4, new_tokens=4, prompt_len=2, device="cpu"):
    """A random-weight Llama (transformers' `LlamaForCausalLM`, the architecture of SmolLM2) wrapped as the HF
    causal-LM teacher: the real `DynamicCache`, cropped on rollback; prompts are fixed random token rows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from teachers.pretrained.hf_causal_lm import HFCausalLMTeacher

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    network = LlamaForCausalLM(config)
    for p in network.parameters():  # larger weights than the init, so the logits depend strongly on the prefix
        p.data.mul_(6.0)
    prompts = torch.randint(vocab, (3, prompt_len), generator=torch.Generator().manual_seed(seed))
    return HFCausalLMTeacher("tiny-llama", network.to(device), CharTokenizer(vocab), prompts.to(device), ["ab"],
                             new_tokens, {})


def make_config(cls, **knobs):
    """A method config from flat knobs, as the CLI builds it (`sampling` knobs by their own names)."""
    from core.config import build_config

    return build_config(cls, knobs, owner=cls.__name__)
