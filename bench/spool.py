"""An arm's samples, spooled to disk batch by batch, so a trial's memory does not grow with n_samples.

The runner writes each sampled batch as it comes (outside the timed region) and reads the spool back in chunks of a
bounded size to score it: memory holds one chunk, whatever the number of samples.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch


class Spool:
    def __init__(self, folder: Path):
        folder.mkdir(parents=True)
        self.folder, self.batches, self.n = folder, 0, 0

    def append(self, data: torch.Tensor, cond: torch.Tensor) -> None:
        torch.save((data.cpu(), cond.cpu()), self.folder / f"{self.batches:07d}.pt")
        self.batches += 1
        self.n += len(data)

    def chunks(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(samples, conditions) in sampling order, `size` at a time (the last chunk may be smaller)."""
        data, cond, held = [], [], 0
        for i in range(self.batches):
            d, c = torch.load(self.folder / f"{i:07d}.pt")
            data.append(d)
            cond.append(c)
            held += len(d)
            while held >= size:
                d, c = torch.cat(data), torch.cat(cond)
                yield d[:size], c[:size]
                data, cond, held = [d[size:]], [c[size:]], held - size
        if held:
            yield torch.cat(data), torch.cat(cond)
