"""`vit-einops decompose MODEL --image PATH --out DIR`: the score split exactly into each head's and MLP's direct
share and the named rest (:func:`vit_einops.inspect.decompose`; docs/decomposition.md), for the predicted class, or
for a model without a classifier a backbone target (--target-embedding, --target-image, --target-patch).

The top heads and MLPs by share go to stdout; --out DIR receives decomposition.json (the total, every head's and
MLP's share, the rest and its parts) and decomposition.png (the heads' shares, the split, the heads' source map),
written as one unit. The image goes through the model's own preprocessing.
"""

from __future__ import annotations

import argparse
import time

from ._model import add_model_arguments, add_target_arguments, files_read_by_model, load_model_from_args

OUT_FILES = frozenset(("decomposition.json", "decomposition.png"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--image", required=True, metavar="FILE", help="the image whose score is decomposed")
    parser.add_argument("--top", type=int, default=10, help="heads and MLPs printed, largest share first "
                        "(default %(default)s)")  # fmt: skip
    parser.add_argument("--out", required=True, metavar="DIR", help="where decomposition.json and .png go")
    parser.add_argument("--force", action="store_true", help="replace an earlier decomposition in --out")
    add_target_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..base.checks import check_positive_int
    from ..base.io import check_output, output_lock

    check_positive_int("--top", args.top)
    check_output(args.out, [*files_read_by_model(args.model, args.source), args.image])
    with output_lock(args.out, parents=True):  # held from the first check to the commit
        return _decompose(args)


def _decompose(args: argparse.Namespace) -> int:
    import json

    from ..base.io import atomic_write_bytes, check_directory_output, staged_directory
    from ..base.plot import save_figure
    from ..base.text import printable
    from ..inputs import model_inputs as batch_of
    from ..inspect.decompose import decompose
    from ._model import target_from_args

    check_directory_output(args.out, OUT_FILES, args.force)  # before the work; checked again at the commit
    target = target_from_args(args)  # a bad target file is refused before any model loads
    model = load_model_from_args(args).eval()
    image = batch_of(model, [args.image])
    start = time.perf_counter()
    result = decompose(model, image, target, by_source=True, preprocessed=True)
    seconds = time.perf_counter() - start
    numbers = result.to_json()
    if target is None:
        numbers["class"] = int(model(image).argmax(-1)[0])
    report = json.dumps(numbers | {"seconds": seconds}, indent=1) + "\n"
    with staged_directory(args.out, owned=OUT_FILES, replace=args.force) as staging:
        atomic_write_bytes(staging / "decomposition.json", report.encode(), replace=False)
        save_figure(result.plot(), staging / "decomposition.png", replace=False)
    what = f"class {numbers['class']}'s logit" if target is None else "the target's score"
    print(f"{what}: {numbers['total']:.6g} = heads {float(result.heads.sum()):.6g} + MLPs "
          f"{float(result.mlps.sum()):.6g} + rest {numbers['rest']:.6g}")  # fmt: skip
    for name, share in result.top(args.top):
        print(f"  {name:>8}  {share:+.6g}")
    for name, value in numbers["parts"].items():
        print(f"  rest: {name}: {value:+.6g}")
    print(f"{seconds:.2f} s; written to {printable(args.out)}")
    return 0
