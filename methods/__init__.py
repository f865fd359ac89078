"""Acceleration methods; importing this package registers them."""
from methods import ar, dd, jacobi, onestep, sjd, skip  # noqa: F401
