"""The benchmark behind ``vit-einops bench``: einsum, chunked and SDPA attention, and whole models.

- :mod:`.measure`: timing (torch.utils.benchmark, interleaved), peak memory (profiler), matmul ceiling.
- :mod:`.device`: what differs on CUDA (event clock, L2 flush, peak memory) and which dtype each device may run.
- :mod:`.attention`: the attention grid (core Eq. 6-7 and the whole layer against nn.MultiheadAttention).
- :mod:`.model`: images/s of the presets, each attention path against torch's nn.TransformerEncoderLayer.
- :mod:`.paired`: each ratio as the median of per-round ratios, with a bootstrap 95% interval.
- :mod:`.noise`: whether a row's timing is trustworthy (load average, IQR/median) and the run's verdict.
- :mod:`.report`: the table, results.json and the CSV files (their schema).
- :mod:`.results`: the reader of results.json, which checks what its readers rely on (no torch).
- :mod:`.plots`: the plots, as matplotlib Figures (one N or many; bars from zero).
- :mod:`.run`: the named grids (default, quick, smoke) and one run from options to files.

- :mod:`.names`: the paths, modes and numeric ranges (no torch: the command line's --help reads them).
"""

from __future__ import annotations

from ..base.lazy import lazy_exports

_EXPORTS = {"GRIDS": "runner", "BenchOptions": "runner", "run": "runner", "with_overrides": "runner"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
