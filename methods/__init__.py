"""Acceleration methods; importing this package registers them."""
from methods import ar, ard, cspd, dd, ddim, jacobi, onestep, sjd, skip  # noqa: F401
