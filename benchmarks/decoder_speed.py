"""Image decoding against the official code, side by side: each tokenizer's decoder at full size with the same random
weights (the official module's, loaded into ours through our loader of the released layout), one image per call,
timed interleaved under the latency protocol (`core.latency`), with the largest difference of the two images.

The official code is not part of AccelBench: clone the four repositories into one folder and name it.

    git clone https://github.com/FoundationVision/VAR          OFFICIAL/VAR
    git clone https://github.com/FoundationVision/LlamaGen     OFFICIAL/LlamaGen
    git clone https://github.com/LTH14/mar                     OFFICIAL/mar
    git clone https://github.com/facebookresearch/chameleon    OFFICIAL/chameleon
    python benchmarks/decoder_speed.py --official OFFICIAL [--threads 1] [--only var]

Issue 40's target: each within 10 % of the official decode time. The note of the commit that added this file gives
the figures measured on this project's CPU machine.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

from core.latency import LatencyProtocol, measure
from teachers.networks import chameleon_vqgan, kl16, msvq, vq16
from teachers.networks.var import PATCH_NUMS


def _official(folder: Path, repo: str, module: str):
    """`module` of the official repository `folder/repo`, imported from there (its own package layout)."""
    sys.path.insert(0, str(folder / repo))
    try:
        for name in [m for m in sys.modules if m.split(".")[0] in ("models", "tokenizer", "chameleon")]:
            del sys.modules[name]  # VAR's and MAR's packages are both `models`
        return importlib.import_module(module)
    finally:
        sys.path.pop(0)


def var(folder: Path, g: torch.Generator):
    official = _official(folder, "VAR", "models.vqvae").VQVAE(vocab_size=4096, z_channels=32, ch=160, test_mode=True,
                                                               share_quant_resi=4, v_patch_nums=PATCH_NUMS)
    ours = msvq.load_decoder_state(msvq.MultiScaleVQ(msvq.MSVQConfig()), official.state_dict())
    idx = [torch.randint(4096, (1, pn * pn), generator=g) for pn in PATCH_NUMS]  # (1, pn^2) per scale
    return (lambda: official.idxBl_to_img(idx, same_shape=True, last_one=True)), (lambda: ours.decode_codes(idx))


def llamagen(folder: Path, g: torch.Generator):
    official = _official(folder, "LlamaGen", "tokenizer.tokenizer_image.vq_model").VQ_16()
    ours = vq16.load_decoder_state(vq16.VQ16Decoder(vq16.VQDecoderConfig()), official.state_dict())
    codes = torch.randint(16384, (1, 256), generator=g)  # (1, 16 * 16)
    return (lambda: official.decode_code(codes, shape=(1, 8, 16, 16))), (lambda: ours(codes, (16, 16)))


def mar(folder: Path, g: torch.Generator):
    official = _official(folder, "mar", "models.vae").AutoencoderKL(embed_dim=16, ch_mult=(1, 1, 2, 2, 4))
    ours = kl16.load_decoder_state(kl16.KL16Decoder(kl16.KL16Config()), official.state_dict())
    z = torch.randn(1, 16, 16, 16, generator=g)  # (1, embed_dim, 16, 16)
    return (lambda: official.decode(z)), (lambda: ours.decode(z))


def chameleon(folder: Path, g: torch.Generator):
    cfg = chameleon_vqgan.ChameleonVQConfig()
    dd = {"double_z": False, "z_channels": cfg.z_channels, "resolution": cfg.resolution, "in_channels": 3,
          "out_ch": 3, "ch": cfg.ch, "ch_mult": list(cfg.ch_mult), "num_res_blocks": cfg.num_res_blocks,
          "attn_resolutions": list(cfg.attn_resolutions), "dropout": 0.0}
    official = _official(folder, "chameleon", "chameleon.inference.vqgan").VQModel(dd, cfg.n_embed, cfg.embed_dim)
    ours = chameleon_vqgan.load_vqgan_state(chameleon_vqgan.ChameleonVQGAN(cfg), official.state_dict())
    codes = torch.randint(cfg.n_embed, (1, 1024), generator=g)  # (1, 32 * 32): a 512-px image

    def decode_official():  # image_tokenizer.py `pil_from_img_toks`, before the conversion to 8-bit pixels
        return official.decode(official.quantize.get_codebook_entry(codes, (1, 32, 32, cfg.embed_dim)))
    return decode_official, (lambda: ours(codes, (32, 32)))


DECODERS = {"var": var, "llamagen": llamagen, "mar": mar, "chameleon": chameleon}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official", type=Path, required=True, help="folder holding the four official repositories")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", choices=sorted(DECODERS), action="append", help="one decoder (repeatable)")
    ap.add_argument("--min-count", type=int, default=5, help="timed calls per decoder and side (default 5)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    protocol = LatencyProtocol(warmup=1, min_count=args.min_count, min_seconds=0.0)
    print(f"| decoder | official s/image | ours s/image | ours / official | max abs diff |  ({args.threads} thread(s))")
    print("|---|---|---|---|---|")
    for name in args.only or DECODERS:
        torch.manual_seed(0)
        official, ours = DECODERS[name](args.official, torch.Generator().manual_seed(0))
        with torch.inference_mode():
            diff = (official().clamp(-1, 1) - ours().clamp(-1, 1)).abs().max().item()
            t = measure({"official": official, "ours": ours}, protocol, torch.device("cpu"), 1)
        a, b = t["official"].median, t["ours"].median
        print(f"| {name} | {a:.3f} | {b:.3f} | {b / a:.3f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
