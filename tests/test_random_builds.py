"""The full-size random builds of the cost mode (`Teacher.random`, `bench.cost`) of the MAR, LlamaGen text-to-image,
Lumina-mGPT / Anole, Emu3-Gen, SmolLM2 and `hf:<folder>` teachers, on the meta device, against the full-size key sets
recorded from the official code (tests/fixtures/<name>/MAKING.md) or, where no fixture holds them, the released
sizes' parameter counts: the same modules as the loaders build, without a file."""
import json
import math
import re
from pathlib import Path

import pytest
import torch

from core.errors import UserError
from teachers import teacher_class
from teachers.networks.mar import official_to_ours
from teachers.pretrained.chameleon import DROPPED, QK_NORMS

FIXTURES = Path(__file__).parent / "fixtures"
META = torch.device("meta")


def shapes(module: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in module.state_dict().items()}


def numel(keys: dict[str, list[int]]) -> int:
    return sum(math.prod(shape) for shape in keys.values())


def random(name: str, tmp_path: Path):
    return teacher_class(name, tmp_path).random(name, META)


@pytest.mark.parametrize("name, target", [("mar-h", "mar_huge"), ("mar-l", "mar_large")])
def test_mar_targets_and_the_mar_b_draft_are_the_released_models(name, target, tmp_path):
    """tests/fixtures/mar/mar_keys.json: LTH14/mar's `mar_*` with the released DiffLoss heads, the KL-16 VAE."""
    official = json.loads((FIXTURES / "mar" / "mar_keys.json").read_text())
    teacher = random(name, tmp_path)
    for model, network in ((target, teacher.target.network), ("mar_base", teacher.draft.network)):
        keys = {k: list(v) for k, v in official_to_ours(official[model]["keys"]).items()}
        assert shapes(network) == keys and numel(keys) == official[model]["num_values"]
    assert (teacher.info["target_n_params"], teacher.info["draft_n_params"]) == (
        official[target]["num_parameters"], official["mar_base"]["num_parameters"])  # 942.4 M / 478.3 M; 207.9 M
    decoder = {k: v for k, v in official["kl16_vae"]["keys"].items() if not k.startswith(("encoder.", "quant_conv."))}
    assert shapes(teacher.vae) == decoder


@pytest.mark.parametrize("name, side", [("llamagen-t2i-xl-256", 16), ("llamagen-t2i-xl-512", 32)])
def test_llamagen_t2i_gpt_is_the_official_gpt_xl_and_starts_on_the_meta_device(name, side, tmp_path):
    """tests/fixtures/llamagen_t2i/GPT-XL-t2i.keys.json (both stages: no position table); no T5 is built. On the meta
    device a caption is shapes only (`caption_embeddings`), so the cost mode's sample can start."""
    official = json.loads((FIXTURES / "llamagen_t2i" / "GPT-XL-t2i.keys.json").read_text())
    teacher = random(name, tmp_path)
    assert shapes(teacher.gpt) == official["keys"] and numel(official["keys"]) == official["n_params"]
    assert teacher.t5 is None and teacher.grid == (side, side)
    cond = teacher.conditions(1, torch.Generator().manual_seed(0)).to(META)
    _, logits = teacher.start(cond, cfg=7.5)
    assert logits.shape == (1, 16384) and logits.is_meta


@pytest.mark.parametrize("name, outputs", [("lumina-mgpt-7b-512", 1061), ("lumina-mgpt-7b-768", 2357),
                                           ("lumina-mgpt-7b-1024", 4165), ("anole-7b", 1026)])
def test_chameleon_7b_is_lumina_mgpts_module_as_the_loader_builds_it(name, outputs, tmp_path):
    """tests/fixtures/chameleon/Lumina-mGPT-7B.keys.json less the loader's drop (the VQ-VAE encoder), its QK norms
    repeated over the heads: 419 tensors, 7,013,666,816 values (tests/test_chameleon_keys.py); the VQGAN decoder is
    tests/fixtures/chameleon_vqgan/ChameleonVQ.keys.json less the encoder. The structure's lengths are the
    teachers' (the chameleon module's docstring: 2357 outputs at 768 px, the SJD paper's count)."""
    official = json.loads((FIXTURES / "chameleon" / "Lumina-mGPT-7B.keys.json").read_text())
    heads = {QK_NORMS[0]: official["config"]["num_attention_heads"],
             QK_NORMS[1]: official["config"]["num_key_value_heads"]}
    loaded = {}
    for key, shape in official["keys"].items():
        if not key.startswith(DROPPED):
            norm = next((n for n in QK_NORMS if n in key), None)
            loaded[key] = [heads[norm], shape[1]] if norm else shape
    teacher = random(name, tmp_path)
    assert shapes(teacher.model) == loaded and numel(loaded) == teacher.info["n_params"] == 7_013_666_816
    vq = json.loads((FIXTURES / "chameleon_vqgan" / "ChameleonVQ.keys.json").read_text())["keys"]
    assert shapes(teacher.vq) == {k: v for k, v in vq.items() if not k.startswith(("encoder.", "quant_conv."))}
    assert teacher.seq_len == outputs and len(teacher.prompt_ids) == 1


def test_emu3_gen_is_the_released_lm_and_vision_tokenizer(tmp_path):
    """The LM's key names are those of tests/fixtures/emu3/Emu3-tiny.keys.json (transformers' conversion of
    Emu3-Gen-hf, at another depth and width; the disk names `text_model.model.*`, `text_model.lm_head.*`, `vqmodel.*`
    are transformers 5's `model.text_model.*`, `lm_head.*`, `model.vqmodel.*`); its size is BAAI/Emu3-Gen's seven
    float32 shards, 33.97 GB (4.94 + 4.83 + 5 + 5 + 4.83 + 5 + 4.37): 8.49 B values; the VQ-VAE's is
    BAAI/Emu3-VisionTokenizer's 1.08 GB model.safetensors: 0.27 B. 8193 outputs at 720 px, the SJD paper's count."""
    disk = json.loads((FIXTURES / "emu3" / "Emu3-tiny.keys.json").read_text())["keys"]
    renamed = {re.sub(r"^text_model\.model\.", "model.text_model.", re.sub(r"^text_model\.lm_head\.", "lm_head.", k))
               for k in disk if not k.startswith("vqmodel.")}
    teacher = random("emu3-gen", tmp_path)
    ours = shapes(teacher.model)
    lm = {k: v for k, v in ours.items() if not k.startswith("model.vqmodel.")}

    def any_depth(keys):
        return {re.sub(r"(?<=\.)\d+(?=\.)", "*", k) for k in keys}

    assert any_depth(lm) == any_depth(renamed)
    assert round(numel(lm) / 1e9, 2) == 8.49 and round((numel(ours) - numel(lm)) / 1e9, 2) == 0.27
    parameters = sum(p.numel() for p in teacher.model.parameters())  # the VQ's BatchNorm statistics are buffers
    assert teacher.info["n_params"] == parameters and teacher.seq_len == 8193 and teacher.grid == (90, 91)


def test_smollm2_is_the_released_135m(tmp_path):
    """134,515,008 values: the 272 tensors of the wheel's SmolLM2-135M-Instruct.Q4_1.gguf (no output matrix: tied)."""
    teacher = random("smollm2-135m-instruct", tmp_path)
    assert teacher.info["n_params"] == 134_515_008 and teacher.network.config.tie_word_embeddings
    assert teacher.seq_len == 64
    assert teacher.conditions(2, torch.Generator().manual_seed(0)).shape == (2, 8)  # the cost mode's first draw


@pytest.mark.parametrize("folder, millions", [("gpt2", 124), ("gpt2-medium", 355), ("gpt2-large", 774),
                                              ("gpt2-xl", 1558)])
def test_absent_gpt2_folders_are_built_at_the_released_sizes(folder, millions, tmp_path):
    """openai/gpt-2's README names its models 124M, 355M, 774M and 1558M (the paper's 117M ... 1542M were wrong, it
    says); unconditional from `<|endoftext|>`, 1023 tokens."""
    teacher = random(f"hf:{folder}", tmp_path)
    assert round(teacher.info["n_params"] / 1e6) == millions
    assert (teacher.bos_id, teacher.seq_len, teacher.vocab_size) == (50256, 1023, 50257)
    assert teacher.conditions(2, torch.Generator().manual_seed(0)).shape == (2, 0)  # the cost mode's first draw


def test_a_present_folder_is_built_from_its_config_and_an_unknown_absent_one_is_refused(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=128, vocab_size=100).save_pretrained(tmp_path / "lm")
    teacher = random("hf:lm", tmp_path)
    assert teacher.network.config.n_layer == 2 and teacher.seq_len == 127 and teacher.vocab_size == 100
    with pytest.raises(UserError, match="no .*config.json to build it from.*gpt2-xl"):
        random("hf:absent", tmp_path)
