"""The models of ours lm-eval scores (`metrics.lambada`'s tasks): `MDLMHarnessLM`, a masked-diffusion denoiser as
SDTT's release scores LAMBADA, and `CausalHarnessLM`, our tiny causal LMs, both on lm-eval's `LM`. Apart from
`metrics.lambada` so that planning an lm-eval row (`check`, `directions`) imports no lm-eval: `make gpu-bench` plans
every paper suite on a box with torch and PyYAML alone."""
from __future__ import annotations

import torch
from lm_eval.api.model import LM
from tqdm import tqdm

from teachers.families import masked_diffusion as md

# multi_round_sdtt.py:700-704 with config.yaml:126-132 (eval.lambada_openai: num_samples 32, batch_size 32, add_bos and
# add_eos true): 32 antithetic times in one batch
ELBO_SAMPLES = 32


class _TokenLM(LM):
    """lm-eval's loglikelihood requests -> `_score(context, continuation)` each: (log-likelihood, is_greedy)."""

    def __init__(self, encode, seq_len: int, progress: bool = True):
        super().__init__()
        self.encode, self.seq_len, self.progress = encode, seq_len, progress

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        # else tqdm's own default (TQDM_DISABLE)
        quiet = {"disable": True} if disable_tqdm or not self.progress else {}
        return [self._score(*r.args) for r in tqdm(requests, desc="log-likelihoods", leave=False, **quiet)]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("the tasks here need loglikelihood only")

    def generate_until(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("the tasks here need loglikelihood only")


class MDLMHarnessLM(_TokenLM):
    """A masked-diffusion denoiser scored as SDTT's release scores LAMBADA (multi_round_sdtt.py:698-846).

    The sequence is BOS + context + continuation + EOS, context and continuation encoded apart (the release's
    dataloader.py:298-330 splits the text at its last space and tokenises the two halves, dataloader.py:78-84
    adding the tokenizer's BOS before the first and its EOS after the second; GPT-2's BOS is its EOS); a context
    too long for the model loses its oldest tokens, the BOS kept. Neither end token is ever masked or scored (the
    release restores both after masking, multi_round_sdtt.py:714-717).
    - is_greedy: every continuation token masked, one pass, the argmax of each (SUBS puts no mass on MASK, the
      release's `preds[..., :-1]`) equal to the token (`eval_lambada`, multi_round_sdtt.py:789-804);
    - log-likelihood: minus the NELBO bound, the mean over `samples` antithetic t (seeded alike for every request,
      so the choices of a question share their draws) of (1/t) x the sum over the masked continuation tokens of
      -log x_theta(z_t)[x], each continuation token masked with probability (1 - eps) t (`eval_suffix_nll`; the
      release's weight dsigma / expm1(sigma) is 1/t under the log-linear schedule)."""

    def __init__(self, denoise, encode, bos_id: int, eos_id: int, seq_len: int, mask_id: int, device: torch.device,
                 seed: int = 0, samples: int = ELBO_SAMPLES, progress: bool = True):
        super().__init__(encode, seq_len, progress)
        self.denoise, self.bos_id, self.eos_id, self.mask_id = denoise, bos_id, eos_id, mask_id
        self.torch_device = device
        self.seed, self.samples = seed, samples

    def frame(self, context: str, continuation: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(1, T) ids BOS + context + continuation + EOS within the model's length, and the continuation's (1, T)
        mask."""
        ctx, cont = self.encode([context, continuation])
        cont = cont[: self.seq_len - 2]
        ctx = ctx[max(0, len(ctx) - (self.seq_len - 2 - len(cont))):]
        x = torch.tensor([self.bos_id, *ctx, *cont, self.eos_id], device=self.torch_device)[None]
        target = torch.zeros_like(x, dtype=torch.bool)
        target[:, 1 + len(ctx): -1] = True
        return x, target

    @torch.inference_mode()
    def _score(self, context: str, continuation: str) -> tuple[float, bool]:
        x, target = self.frame(context, continuation)
        one_pass = self.denoise(torch.where(target, self.mask_id, x))  # (1, T, V+1)
        greedy = bool((one_pass[target].argmax(-1) == x[target]).all())
        g = torch.Generator(self.torch_device).manual_seed(self.seed)
        t = md.antithetic_times(self.samples, g, self.torch_device)  # (S,)
        xs = x.expand(self.samples, -1)
        masked = (torch.rand(xs.shape, generator=g, device=self.torch_device) < md.mask_prob(t)[:, None]) & target
        nll = -self.denoise(torch.where(masked, self.mask_id, xs)).gather(-1, xs[..., None]).squeeze(-1)  # (S, T)
        return -((nll * masked).sum(1) / t).mean().item(), greedy


class CausalHarnessLM(_TokenLM):
    """An unconditional AR-token teacher of ours (BOS, then the text), scored with its KV cache."""

    def __init__(self, lm, device: torch.device, progress: bool = True):
        super().__init__(lm.encode, lm.seq_len, progress)
        self.lm, self.torch_device = lm, device

    @torch.inference_mode()
    def _score(self, context: str, continuation: str) -> tuple[float, bool]:
        ctx, cont = self.encode([context, continuation])
        cont = cont[: self.seq_len - 1]
        ctx = ctx[max(0, len(ctx) - (self.seq_len - len(cont))):]
        x = torch.tensor(ctx + cont, device=self.torch_device)[None]
        state, first = self.lm.start(torch.zeros(1, 0, dtype=torch.long, device=self.torch_device), cfg=1.0)
        logits = (torch.cat([first[:, None], self.lm.extend(state, x[:, :-1])], 1) if x.shape[1] > 1
                  else first[:, None])
        logp = logits.float().log_softmax(-1)[0, len(ctx):]  # (len(cont), V)
        tokens = x[0, len(ctx):]
        return logp.gather(-1, tokens[:, None]).sum().item(), bool((logp.argmax(-1) == tokens).all())
