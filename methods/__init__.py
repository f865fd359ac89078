"""Acceleration methods; importing this package registers them."""
from methods import ar, cspd, dd, jacobi, onestep, sjd, skip  # noqa: F401
