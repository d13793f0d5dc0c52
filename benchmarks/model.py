"""The whole-model benchmark alone: images/s of ViT presets per attention path, against torch's layers.

    python benchmarks/model.py                                         # vit_ti_16, vit_s_16, vit_b_16, batch 1
    python benchmarks/model.py --models vit_b_16 --model-batch 32 --model-modes inference --rounds 2

Every option of `vit-einops bench` applies; see benchmarks/README.md for what is measured and written.
"""

import sys

from vit_einops.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--skip-attention", *sys.argv[1:]]))
