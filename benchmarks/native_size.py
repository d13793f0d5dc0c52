"""The study commands at DINOv2's native size: ViT-S/14 at 518 px (1,374 tokens with 4 registers, 1,370 without).

    python benchmarks/native_size.py                       # explore side by side, explore one, inspect
    python benchmarks/native_size.py --runs explore2 --json native.json

Two random-weight models are built and saved (`create_vit("vit_small_patch14_reg4_dinov2")` and
`create_vit("vit_small_patch14_dinov2")`, seed 0), then each command runs in its own process under
`/usr/bin/time -v` on one photo (scikit-learn's china.jpg):

- `explore2`: `vit-einops explore reg.safetensors plain.safetensors --image photo.png --out page.html`
- `explore1`: the same with the registers model alone
- `inspect`: `vit-einops inspect reg.safetensors --image photo.png --out DIR`

For each: wall time, peak RSS (the process's maximum resident set), the page's size, and the memory the command
estimates for itself (the "needs about" of its refusal under `--max-memory 300MiB`: enough to load a model of
88 MB, too little for the run, which stops before any forward pass). The goals of the project's issue for this size
(a page of at most 40 MB for one model and 80 MB for two,
at most 3 GB of peak memory, under 60 s on 2 cores, an estimate within 1.5x of the measured peak) are printed
beside each number; they are goals to read, never assertions in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOALS = {"seconds": 60.0, "peak_bytes": 3e9, "explore1_bytes": 40e6, "explore2_bytes": 80e6, "estimate_ratio": 1.5}
RUNS = ("explore2", "explore1", "inspect")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def build_models(folder: Path) -> tuple[Path, Path, Path]:
    """(registers model, plain model, photo) saved in ``folder``: random weights, seed 0, DINOv2's 518 px."""
    import torch
    from vit_einops import create_vit, save_vit
    from vit_einops.images import sample_images

    torch.manual_seed(0)
    paths = folder / "reg.safetensors", folder / "plain.safetensors", folder / "photo.png"
    save_vit(create_vit("vit_small_patch14_reg4_dinov2").eval(), paths[0], overwrite=True)
    save_vit(create_vit("vit_small_patch14_dinov2").eval(), paths[1], overwrite=True)
    sample_images()[0][0].save(paths[2])
    return paths


def command(run: str, folder: Path) -> tuple[list[str], Path]:
    """The vit-einops arguments of ``run`` and what it writes."""
    reg, plain, photo = folder / "reg.safetensors", folder / "plain.safetensors", folder / "photo.png"
    if run == "inspect":
        out = folder / "inspect"
        return ["inspect", str(reg), "--image", str(photo), "--out", str(out), "--force"], out
    out = folder / f"{run}.html"
    models = [str(reg), str(plain)] if run == "explore2" else [str(reg)]
    return ["explore", *models, "--image", str(photo), "--out", str(out), "--force"], out


def timed(args: list[str], threads: int, folder: Path) -> dict[str, float]:
    """Run ``python -m vit_einops ARGS`` under /usr/bin/time -v: wall seconds, CPU seconds (user and system, all
    threads: what a busy machine inflates least) and peak RSS in bytes."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-v", sys.executable, "-m", "vit_einops", *args],
        env=env,
        cwd=folder,  # `python -m` puts its folder first on sys.path: never a checkout other than PYTHONPATH's
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"vit-einops {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    cpu = sum(float(re.search(rf"{kind} time \(seconds\): ([\d.]+)", done.stderr)[1]) for kind in ("User", "System"))
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_bytes": int(rss[1]) * 1024}


def estimate(args: list[str], probe: str, folder: Path) -> float:
    """The memory the command says it needs: its refusal under --max-memory ``probe`` names it."""
    done = subprocess.run(
        [sys.executable, "-m", "vit_einops", *args, "--max-memory", probe], cwd=folder, capture_output=True, text=True
    )
    need = re.search(r"needs about ([\d.]+) (\w+)", done.stderr)
    if done.returncode != 2 or need is None:
        raise SystemExit(f"expected a refusal naming the estimate, got exit {done.returncode}:\n{done.stderr}")
    return float(need[1]) * _UNITS[need[2]]


def open_in_browser(page: Path) -> dict[str, float | int]:
    """Open ``page`` in headless chromium (Debian's, driven by selenium): seconds until it is ready (every array
    decoded, every view wired), then the seconds to draw each view, and the console's errors."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    try:
        driver.set_page_load_timeout(300)
        start = time.perf_counter()
        driver.get(page.resolve().as_uri())
        WebDriverWait(driver, 300).until(lambda d: d.find_element("tag name", "body").get_attribute("data-ready"))
        row = {"ready_s": time.perf_counter() - start}
        for view in ("attention", "dino", "rollout", "norms", "similarity", "pca"):
            start = time.perf_counter()
            Select(driver.find_element("id", "view-select")).select_by_value(view)
            row[f"{view}_s"] = time.perf_counter() - start
        row["console_errors"] = sum(entry["level"] == "SEVERE" for entry in driver.get_log("browser"))
        return row
    finally:
        driver.quit()


def size_of(out: Path) -> int:
    return sum(p.stat().st_size for p in out.iterdir()) if out.is_dir() else out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated, of " + ", ".join(RUNS))
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each run (default %(default)s)")
    parser.add_argument("--folder", help="keep the models and outputs here (default: a temporary folder)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument(
        "--browser", action="store_true", help="also open each page in headless chromium: load and draw times"
    )
    parser.add_argument(
        "--probe", default="300MiB", help="the --max-memory whose refusal names the estimate (default %(default)s)"
    )
    args = parser.parse_args(argv)
    runs = args.runs.split(",")
    if not set(runs) <= set(RUNS):
        parser.error(f"--runs takes {', '.join(RUNS)}, got {args.runs}")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.folder or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        build_models(folder)
        rows = []
        header = ("run", "time", "CPU", "peak RSS", "output", "estimate", "est/peak")
        print("{:<9} {:>8} {:>8} {:>10} {:>10} {:>10} {:>8}   goals".format(*header))
        for run in runs:
            argv_run, out = command(run, folder)
            row = {"run": run, **timed(argv_run, args.threads, folder), "output_bytes": size_of(out)}
            row["estimate_bytes"] = estimate(argv_run, args.probe, folder)
            row["estimate_ratio"] = row["estimate_bytes"] / row["peak_bytes"]
            if args.browser and run != "inspect":
                row["browser"] = open_in_browser(out)
                print(f"{run:<9} in chromium: {row['browser']}")
            rows.append(row)
            page_goal = GOALS.get(f"{run}_bytes")
            goals = f"< {GOALS['seconds']:.0f} s, <= {GOALS['peak_bytes'] / 1e9:.0f} GB"
            goals += f", <= {page_goal / 1e6:.0f} MB" if page_goal else ""
            goals += f", estimate within {GOALS['estimate_ratio']}x"
            print(
                f"{run:<9} {row['seconds']:7.1f}s {row['cpu_seconds']:7.1f}s {row['peak_bytes'] / 1e9:8.2f}GB "
                f"{row['output_bytes'] / 1e6:8.1f}MB "
                f"{row['estimate_bytes'] / 1e9:8.2f}GB {row['estimate_ratio']:8.2f}   {goals}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
