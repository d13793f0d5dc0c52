"""The benchmark behind ``vit-einops bench``: einsum, chunked and SDPA attention, and whole models.

- :mod:`.measure`: timing (torch.utils.benchmark, interleaved), peak memory (profiler), matmul ceiling.
- :mod:`.attention`: the attention grid (core Eq. 6-7 and the whole layer against nn.MultiheadAttention).
- :mod:`.model`: images/s of the presets, each attention path against torch's nn.TransformerEncoderLayer.
- :mod:`.noise`: whether a row's timing is trustworthy (load average, IQR/median) and the run's verdict.
- :mod:`.report`: the table, results.json, the CSV files (their schema) and the plots (matplotlib Figures).
- :mod:`.run`: the named grids (default, quick, smoke) and one run from options to files.
"""

from .run import GRIDS, BenchOptions, run, with_overrides

__all__ = ["GRIDS", "BenchOptions", "run", "with_overrides"]
