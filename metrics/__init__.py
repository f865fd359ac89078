"""Quality metrics; importing this package registers them."""
from metrics import fid  # noqa: F401
