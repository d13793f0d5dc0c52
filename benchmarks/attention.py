"""The attention microbenchmark alone: `vit-einops bench` without the whole models.

    python benchmarks/attention.py                      # default grid (b 1; N 50,197,577,1025; h 12; d 64)
    python benchmarks/attention.py --batches 32 --tokens 197,1025 --modes forward --no-compile
    python benchmarks/attention.py --quick

Every option of `vit-einops bench` applies; see benchmarks/README.md for what is measured and written.
"""

import sys

from vit_einops.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--skip-model", *sys.argv[1:]]))
