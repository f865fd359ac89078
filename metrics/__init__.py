"""Quality metrics; importing this package registers them."""
from metrics import (clip_score, fid, gen_ppl, hpsv2, inception_score, kid, mauve_text, precision_recall,  # noqa: F401
                     self_bleu, text_entropy)
