"""Acceleration methods; importing this package registers them."""
from methods import ar, jacobi, sjd  # noqa: F401
