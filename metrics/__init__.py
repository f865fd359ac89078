"""Quality metrics, declared by import path (importing this package imports none of them)."""
from core.registry import METRICS

METRICS.register("clip", "metrics.clip_score:CLIPScore")
METRICS.register("entropy", "metrics.text_entropy:TokenEntropy")
METRICS.register("fid", "metrics.fid:FID")
METRICS.register("gen_ppl", "metrics.gen_ppl:GenPPL")
METRICS.register("hpsv2", "metrics.hpsv2:HPSv2")
METRICS.register("is", "metrics.inception_score:InceptionScore")
METRICS.register("kid", "metrics.kid:KID")
METRICS.register("mauve", "metrics.mauve_text:MAUVE")
METRICS.register("precision", "metrics.precision_recall:Precision")
METRICS.register("recall", "metrics.precision_recall:Recall")
METRICS.register("self_bleu", "metrics.self_bleu:SelfBLEU")
