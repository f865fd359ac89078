"""The 8-bit images SJD's release writes for FID and CLIP (issue 47, item 3), byte for byte: each release's own lines
rewritten here by hand on a fixed tensor of VQ outputs (the bounds, values past them, exact ties, random values) and
compared, after the metrics' rounding to 8 bits (`metrics.inception.to_uint8`, what FID and CLIP read), with the
teachers' `decode` (teachers/pretrained/chameleon.py says where each line is). LlamaGen-T2I's `decode: minmax` is
checked the same way in tests/test_real_llamagen_t2i.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from metrics.inception import to_uint8
from teachers.pretrained.chameleon import chameleon_levels, postprocess_levels
from tests.fakes_chameleon import TinyAnole, TinyLumina, tiny_chameleon_teacher
from tests.test_real_chameleon import valid_sequence

# (1, 3, 8, 8) VQ outputs: both bounds and beyond, the values whose level (x + 1) / 2 * 255 is a tie, then random
EDGES = [-1.5, -1.0, -0.999, -0.5, 0.0, 1 / 255, 0.25, 0.5, 0.989, 0.99, 0.999, 1.0, 1.5,
         *((2 * k + 1) / 255 - 1 for k in range(0, 255, 8))]


def fixed_vq_output() -> torch.Tensor:
    rest = torch.rand(192 - len(EDGES), generator=torch.Generator().manual_seed(0)) * 2.2 - 1.1
    return torch.cat([torch.tensor(EDGES, dtype=torch.float32), rest]).reshape(1, 3, 8, 8)


def lumina_release_bytes(x: torch.Tensor) -> torch.Tensor:
    """Lumina-mGPT's `_pil_from_chw_tensor` (SJD's lumina_mgpt/model/chameleon_vae_ori/image_tokenizer.py:100, :106)
    in other words: from [-1, 1] to [0, 1] in torch, then numpy scales by 255 and its uint8 cast drops the fraction."""
    zero_one = (torch.clamp(x, -1.0, 1.0) + 1.0) / 2.0
    hwc = zero_one[0].permute(1, 2, 0).numpy()
    return torch.from_numpy((hwc * 255).astype(np.uint8)).permute(2, 0, 1)


def anole_release_bytes(x: torch.Tensor) -> torch.Tensor:
    """The Anole path's `postprocess_pixel_values` (leloykun/transformers fc--anole 1ce50c63a,
    image_processing_chameleon.py:405-411, :452) in other words, on the model's bfloat16 output: unnormalise with
    mean and std 1 per channel, scale by the inverse of the 0.0078 rescale factor in place, clip, cast."""
    pixels = x.to(torch.bfloat16)
    ones = torch.ones(3, dtype=torch.bfloat16).view(1, -1, 1, 1)
    pixels = pixels * ones + ones
    pixels *= 1.0 / 0.0078
    return torch.clip(pixels, 0, 255).to(dtype=torch.uint8)[0]


def test_lumina_mgpts_levels_are_its_release_bytes():
    x = fixed_vq_output()
    ours = to_uint8(chameleon_levels(x))[0]
    assert torch.equal(ours, lumina_release_bytes(x))
    rounded = to_uint8(((x + 1) / 2).clamp(0, 1))[0]  # what the metrics made of (x + 1) / 2 before: rounded
    assert (rounded.float() - ours.float()).mean() > 0.3  # brighter: the check above tells rounding apart


def test_anoles_levels_are_the_release_paths_postprocess_bytes():
    x = fixed_vq_output()
    ours = to_uint8(postprocess_levels(x))[0]
    assert torch.equal(ours, anole_release_bytes(x))
    assert not torch.equal(ours, lumina_release_bytes(x))  # 1 / 0.0078, not 127.5: another image than Chameleon's


@pytest.mark.parametrize("cls, release", [(TinyLumina, lumina_release_bytes), (TinyAnole, anole_release_bytes)],
                         ids=["lumina", "anole"])
def test_the_teachers_decode_to_their_release_bytes(cls, release):
    """Through the tiny teachers' `decode` (the VQGAN, then the conversion), every image of random token sequences."""
    teacher = tiny_chameleon_teacher(cls)
    g = torch.Generator().manual_seed(1)
    seqs = torch.stack([valid_sequence(teacher, g) for _ in range(8)])
    with torch.inference_mode():
        vq = teacher.vq(teacher.codes[teacher.image_codes(seqs)], (teacher.side, teacher.side))
        images = to_uint8(teacher.decode(seqs))
    for b in range(len(seqs)):
        assert torch.equal(images[b], release(vq[b : b + 1])), b


def test_anoles_chameleon_mode_is_lumina_mgpts_conversion(tmp_path):
    """`decode: chameleon`: Chameleon's own tokenizer's conversion, GAIR-NLP/anole's, on Anole."""
    from core.errors import UserError

    teacher = tiny_chameleon_teacher(TinyAnole.at(tmp_path, {"decode": "chameleon"}))
    x = fixed_vq_output()
    assert torch.equal(teacher.levels(x), chameleon_levels(x))
    with pytest.raises(UserError, match="decode must be one of postprocess, chameleon, got 'round'"):
        TinyAnole.at(tmp_path, {"decode": "round"})
