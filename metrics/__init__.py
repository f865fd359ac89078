"""Quality metrics; importing this package registers them."""
from metrics import clip_score, fid, hpsv2, inception_score, kid, precision_recall  # noqa: F401
