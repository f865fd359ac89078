"""The tiny embedded VAR (teachers/tiny/image_var.py): its multi-scale pixel-patch tokenizer and a fast recipe
trained here through the family's sampler and `skip-scales`."""
import pytest
import torch

from core.cache import Cache
from teachers.families import multiscale_vq
from teachers.tiny.image_var import ImageVARRecipe, ImageVARTeacher


class FastVAR(ImageVARTeacher):
    """The recipe at a size that trains in seconds: what is tested is the pipeline, not the quality."""

    recipe = ImageVARRecipe(codebook_size=32, kmeans_rounds=2, depth=1, width=32, heads=2, steps=20, batch_size=16)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return FastVAR.load("fast-var", cache=Cache(tmp_path_factory.mktemp("cache")), device=torch.device("cpu"))


def test_each_scale_refines_the_reconstruction(teacher):
    """Decoding the first k scales of a test image's codes: the error falls with k (a residual quantiser), and the
    map's codes round-trip through the teacher's decode."""
    from teachers.data.images import load_image_dataset

    images = load_image_dataset("digits", "test", 16).images[:64]
    codes = teacher.vq.encode_map(FastVAR.to_map(images, 2))
    errors = [torch.mean(((teacher.vq.decode_codes(codes[:k]) + 1) / 2 - images) ** 2).item() for k in range(1, 5)]
    assert errors == sorted(errors, reverse=True) and errors[-1] < errors[0] / 2
    torch.testing.assert_close(teacher.decode(torch.cat(codes, 1)), (teacher.vq.decode_codes(codes) + 1) / 2)
    assert teacher.info["vq_test_mse"] == pytest.approx(errors[-1], rel=0.5)  # all of the test split vs 64 images


def test_the_tiny_var_samples_digits_shaped_images(teacher):
    cond = teacher.conditions(6, torch.Generator().manual_seed(0))
    out = multiscale_vq.sample_scales(teacher, cond, multiscale_vq.SamplingConfig(cfg=1.5),
                                      generator=torch.Generator().manual_seed(1))
    assert out.data.shape == (6, 85) and out.counters["nfe"] == 6 * 4
    images = teacher.decode(out.data)
    assert images.shape == (6, 1, 16, 16) and 0 <= images.min() and images.max() <= 1
