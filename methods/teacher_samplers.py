"""The teachers' own samplers as methods, under their families' sampler names: `ar` (token by token: the reference
arm of SJD, arXiv:2410.01699, and DD, arXiv:2412.17153, and with the target model alone of CSpD, arXiv:2411.11925),
VAR's next-scale sampler (one pass per scale, DD's VAR baseline), `mar` (MAR's masked random-order sampler, CSpD's
teacher's own), `ddim` (DiT's DDIM, eta = 0: at K steps ARD's quality target, at S steps its "same steps, no
distillation" baseline, arXiv:2504.11295) and `mdlm` (MDLM's ancestral sampler, SDTT's, arXiv:2410.21035).

Every trial already runs its teacher's own sampler as the reference arm (`methods.base.TeacherSampler`, the base of
these classes); as a method it runs at other settings than a trial's reference (e.g. `ddim` at 4 steps against the
25-step reference)."""
from __future__ import annotations

from methods.base import TeacherSampler
from teachers.families import ar_token, continuous_ar, masked_ar, masked_diffusion, multiscale_vq, ode_diffusion


class ARSampler(TeacherSampler):
    """The teacher's own autoregressive sampler: one forward pass per token (greedy with `greedy=true`), or per
    scale."""

    families = (ar_token.FAMILY, continuous_ar.FAMILY, multiscale_vq.FAMILY)
    key_knobs = ("greedy",)


class MARSampler(TeacherSampler):
    """MAR's own sampler (the target alone): `num_iter` steps in a random order, each one encoder-decoder pass over
    the known tokens and one head chain per token predicted (CSpD's reference on the masked family)."""

    families = (masked_ar.FAMILY,)
    modalities = ("image",)
    key_knobs = ("num_iter",)


class DDIMSampler(TeacherSampler):
    """The DiT teacher's DDIM sampler with `steps` steps and CFG `cfg` (one batched forward pass per step)."""

    families = (ode_diffusion.FAMILY,)
    modalities = ("image",)
    key_knobs = ("steps",)


class MDLMSampler(TeacherSampler):
    """T ancestral steps from all-MASK (one forward pass each), then the noise-removal pass if a token is left."""

    families = (masked_diffusion.FAMILY,)
    modalities = ("text",)
    key_knobs = ("steps", "cache")
