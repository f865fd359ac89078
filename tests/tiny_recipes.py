"""The registered tiny teachers with seconds-long training recipes (their cache keys change with the recipe).

`tiny_recipe` (conftest) patches them into one test; `tests.tiny_recipes_plugin` installs them in every process that
imports it (`ACCELBENCH_PLUGINS`), e.g. the ranks torchrun starts.
"""
import dataclasses

from teachers.data.text import TextDataRecipe
from teachers.tiny import image_masked_mar
from teachers.tiny.image_mar import ModelSize
from teachers.tiny.registered import (DigitsARClass, DigitsARText, DigitsDiTClass, DigitsMARClass, DigitsMaskedMARClass,
                               DigitsVARClass, DigitsVARClassSmall, FashionARClass, FashionARText, WordNetGPT,
                               WordNetMDLM)


def recipes() -> dict[type, object]:
    out = {cls: dataclasses.replace(cls.recipe, steps=30, n_layer=1, n_embd=32, codebook_size=32)
           for cls in (DigitsARText, DigitsARClass, FashionARText, FashionARClass)}
    size = ModelSize(n_layer=1, n_head=2, n_embd=16, head_width=16, head_depth=1)
    out[DigitsMARClass] = dataclasses.replace(DigitsMARClass.recipe, steps=10, batch_size=4, target=size, draft=size)
    masked = image_masked_mar.ModelSize(16, 1, 2, 16, 1)
    out[DigitsMaskedMARClass] = dataclasses.replace(DigitsMaskedMARClass.recipe, steps=10, batch_size=8, target=masked,
                                                    draft=masked)
    out[DigitsVARClass] = dataclasses.replace(DigitsVARClass.recipe, codebook_size=32, kmeans_rounds=2, depth=1,
                                              width=32, heads=2, steps=20, batch_size=16)
    out[DigitsVARClassSmall] = dataclasses.replace(out[DigitsVARClass], width=16)  # the same codes (k-means recipe)
    out[DigitsDiTClass] = dataclasses.replace(DigitsDiTClass.recipe, steps=10, batch_size=8, hidden=16, depth=2,
                                              heads=2)
    data = TextDataRecipe(vocab_size=300, seq_len=16)
    for cls in (WordNetMDLM, WordNetGPT):
        out[cls] = dataclasses.replace(cls.recipe, data=data, steps=10, batch_size=8, n_layer=1, n_head=2, n_embd=16)
    return out


class QuickDiT(DigitsDiTClass):
    """digits-dit-c2i's test recipe with 4 tokens of 8x8 patches and one block: samples of the same 16x16 pixels
    in a third of the time (tests/test_shards.py makes 46,000 trajectories of it). Registered as `quick-dit` by
    tests.tiny_recipes_plugin."""

    recipe = dataclasses.replace(recipes()[DigitsDiTClass], patch=8, depth=1)
