"""Acceleration methods; importing this package registers them."""
from methods import ar, ard, cspd, dd, ddim, jacobi, lm, mdlm, onestep, sdtt, sjd, skip  # noqa: F401
