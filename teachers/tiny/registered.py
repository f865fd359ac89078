"""The registered tiny teachers: a recipe each (registered by name in `teachers/__init__.py`)."""
import dataclasses

from teachers.tiny.image_ar import ImageARRecipe, ImageARTeacher
from teachers.tiny.image_dit import ImageDiTRecipe, ImageDiTTeacher
from teachers.tiny.image_mar import ImageMARRecipe, ImageMARTeacher
from teachers.tiny.image_masked_mar import MaskedMARRecipe, MaskedMARTeacher
from teachers.tiny.image_var import ImageVARRecipe, ImageVARTeacher
from teachers.tiny.text_gpt import TextGPTTeacher
from teachers.tiny.text_lm import TextLMRecipe
from teachers.tiny.text_mdlm import TextMDLMTeacher


class DigitsARClass(ImageARTeacher):
    """Class-conditional AR transformer over 64 k-means patch tokens of scikit-learn digits (16x16)."""

    recipe = ImageARRecipe(dataset="digits", conditioning="class")


class DigitsARText(ImageARTeacher):
    """Text-conditional AR transformer (open_clip BPE caption prefix) over 64 patch tokens of digits (16x16)."""

    recipe = ImageARRecipe(dataset="digits", conditioning="text")


class FashionARClass(ImageARTeacher):
    """Class-conditional AR transformer over 49 k-means patch tokens of Fashion-MNIST (28x28)."""

    # 7x7 tokens of 4x4 patches. 256 codes: test reconstruction MSE 0.0070 (512 codes: 0.0059, at twice the output
    # vocabulary to learn). Digits' transformer; 2000 steps of 64 images reach a test NLL of 1.51 nats/token
    # (1500 steps of 48: 1.56, with visibly worse samples; width 128: 1.49 at 1.6x the time). 12 caption tokens
    # hold the longest caption untruncated.
    recipe = ImageARRecipe(dataset="fashion-mnist", conditioning="class", image_size=28, patch=4, codebook_size=256,
                           steps=2000, batch_size=64, caption_len=12)


class FashionARText(ImageARTeacher):
    """Text-conditional AR transformer (open_clip BPE caption prefix) over 49 patch tokens of Fashion-MNIST (28x28)."""

    recipe = dataclasses.replace(FashionARClass.recipe, conditioning="text")


class DigitsMARClass(ImageMARTeacher):
    """Class-conditional MAR-style target + draft over 64 continuous 2x2-patch tokens of digits (16x16)."""

    recipe = ImageMARRecipe(dataset="digits")


class DigitsMaskedMARClass(MaskedMARTeacher):
    """Class-conditional MAR target + draft (bidirectional, random order) over 64 continuous 2x2-patch tokens of
    digits (16x16)."""

    recipe = MaskedMARRecipe()


class DigitsVARClass(ImageVARTeacher):
    """Class-conditional VAR (next-scale prediction) over 4 scales (1 to 8 x 8) of multi-scale pixel-patch codes of
    digits (16x16)."""

    recipe = ImageVARRecipe()


class DigitsVARClassSmall(ImageVARTeacher):
    """digits-var-c2i's small sibling: the same data, scales and tokenizer (its k-means codebook is fitted with the same
    recipe and seed, so the codes are the same), a transformer of 2 blocks 64 wide. CoDe's refiner on the tiny
    teacher, as VAR-d16 refines VAR-d30's drafts (docs/methods/code.md)."""

    recipe = dataclasses.replace(ImageVARRecipe(), depth=2, width=64, heads=2)


class DigitsDiTClass(ImageDiTTeacher):
    """Class-conditional DiT (adaLN-Zero, 16 tokens of 4x4 patches) on digits pixels (16x16), DDIM sampler."""

    recipe = ImageDiTRecipe(dataset="digits")


class WordNetMDLM(TextMDLMTeacher):
    """MDLM (bidirectional, no time input) over 64-token BPE chunks of the WordNet glosses timm ships."""

    recipe = TextLMRecipe()
    companion_lm = "wordnet-gpt"


class WordNetGPT(TextGPTTeacher):
    """Causal transformer with a KV cache, trained on the same chunks and tokenizer as wordnet-mdlm."""

    recipe = TextLMRecipe()
    companion_lm = "wordnet-gpt"
