"""Plugin (ACCELBENCH_PLUGINS=tests.tiny_recipes_plugin): every process trains the tiny teachers with the seconds-long
recipes of tests/tiny_recipes.py, and knows its `quick-dit`."""
from core.registry import TEACHERS
from tests.tiny_recipes import recipes

for cls, recipe in recipes().items():
    cls.recipe = recipe

TEACHERS.register("quick-dit", "tests.tiny_recipes:QuickDiT")
