"""Quality metrics; importing this package registers them."""
from metrics import fid, inception_score, kid, precision_recall  # noqa: F401
