"""Teacher families and the registered tiny teachers."""
from bench.registry import TEACHERS
from teachers.image_ar import ImageARRecipe, ImageARTeacher


@TEACHERS.register("digits-ar-c2i")
class DigitsARClass(ImageARTeacher):
    """Class-conditional AR transformer over 64 k-means patch tokens of scikit-learn digits (16x16)."""

    recipe = ImageARRecipe(dataset="digits", conditioning="class")


@TEACHERS.register("digits-ar-t2i")
class DigitsARText(ImageARTeacher):
    """Text-conditional AR transformer (open_clip BPE caption prefix) over 64 patch tokens of digits (16x16)."""

    recipe = ImageARRecipe(dataset="digits", conditioning="text")
