"""The tiny embedded MAR pair (teachers/tiny/image_masked_mar.py): MAR's training recipe at a size that trains in
seconds, through the family's sampler; what is tested is the pipeline, not the quality."""
import torch

from core.cache import Cache
from teachers.families import masked_ar
from teachers.tiny.image_masked_mar import MaskedMARRecipe, MaskedMARTeacher, ModelSize


class FastMaskedMAR(MaskedMARTeacher):
    recipe = MaskedMARRecipe(image_size=8, target=ModelSize(16, 1, 2, 16, 1), draft=ModelSize(8, 1, 2, 8, 1), steps=10,
                             batch_size=8)


def test_the_pair_trains_caches_and_samples_class_conditional_images(tmp_path):
    cache = Cache(tmp_path)
    teacher = FastMaskedMAR.load("fast-masked-mar", cache=cache, device=torch.device("cpu"))
    assert teacher.seq_len == 16 and teacher.token_dim == 4 and teacher.grid == (4, 4)
    assert teacher.info["target_n_params"] > teacher.info["draft_n_params"] > 0
    assert all(torch.isfinite(torch.tensor(teacher.info[f"{w}_test_loss"])) for w in ("target", "draft"))
    again = FastMaskedMAR.load("fast-masked-mar", cache=cache, device=torch.device("cpu"))  # from the cache
    cond = teacher.conditions(4, torch.Generator().manual_seed(0))
    assert cond.min() >= 0 and cond.max() < 10 and teacher.captions(cond)[0].startswith("a handwritten")
    s = masked_ar.SamplingConfig(cfg=2.0, steps=4, num_iter=5)
    out = masked_ar.sample_mar(teacher, cond, s, generator=torch.Generator().manual_seed(1))
    same = masked_ar.sample_mar(again, cond, s, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.data, same.data) and out.counters["nfe"] == 4 * 5
    images = teacher.decode(out.data)
    assert images.shape == (4, 1, 8, 8) and 0 <= images.min() and images.max() <= 1
