"""Regenerate the README's report screenshots under docs/ with headless Chromium.

    python docs/screenshots.py                       # both: the recorded H200 run, and a CPU run made now
    python docs/screenshots.py --cpu-results r.json  # the CPU screenshot from a recorded results.json instead
    python docs/screenshots.py --only h200           # one of them

``docs/h200-report.png`` renders the recorded H200 ``diagnose model`` (``benchmarks/results/h200-2026-12-01/
diagnose_merged_results.json.gz``) with this checkout's report code: the findings are recomputed from the recorded
numbers, every measurement stays as recorded. ``docs/cpu-report.png`` renders a CPU run of the default
(``bubblescope diagnose model``, stories260K where it is found), made by this script in a temporary folder unless
``--cpu-results`` names one. Each page is shot at 1280 CSS pixels wide and cut below its last content (at most
``--max-height`` pixels). Needs Chromium on PATH (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
H200_RESULTS = ROOT / "benchmarks" / "results" / "h200-2026-12-01" / "diagnose_merged_results.json.gz"
WIDTH = 1280


def _load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _cpu_run(out: Path) -> Path:
    """``bubblescope diagnose model`` with the CPU defaults into ``out``; its results.json."""
    cmd = [sys.executable, "-m", "bubblescope", "diagnose", "model", "--device", "cpu", "--out", str(out),
           "--format", "json"]
    print("running:", " ".join(cmd[1:]), file=sys.stderr)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return out / "results.json"


def _trim(png: Path, max_height: int) -> None:
    """Cut the screenshot below its last non-white row (plus a margin), at most ``max_height`` pixels."""
    from PIL import Image, ImageChops

    with Image.open(png) as im:
        im = im.convert("RGB")
        box = ImageChops.difference(im, Image.new("RGB", im.size, (255, 255, 255))).getbbox()
        bottom = min((box[3] + 24) if box else im.height, max_height, im.height)
        im.crop((0, 0, im.width, bottom)).save(png, optimize=True)


def shoot(doc: dict, png: Path, max_height: int) -> Path:
    """Render ``doc`` as the HTML report (findings recomputed) and screenshot it into ``png``."""
    from bubblescope.reports.findings import find
    from bubblescope.reports.html import screenshot_html, write_html

    doc = dict(doc, findings=find(doc))
    with tempfile.TemporaryDirectory(prefix="bubblescope-shot-") as tmp:
        page = write_html(doc, Path(tmp) / "report.html")
        screenshot_html(page, png, width=WIDTH, height=max_height + 200)
    _trim(png, max_height)
    print(f"wrote {png}", file=sys.stderr)
    return png


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("h200", "cpu"), help="regenerate one screenshot only")
    ap.add_argument("--h200-results", type=Path, default=H200_RESULTS, help="recorded H200 results (.json[.gz])")
    ap.add_argument("--cpu-results", type=Path, help="recorded CPU results.json (default: run diagnose now)")
    ap.add_argument("--max-height", type=int, default=6000, help="CSS pixels kept from the top of each page")
    ap.add_argument("--out", type=Path, default=DOCS, help="folder of the PNGs (default: docs/)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))  # this checkout's report code, installed or not
    if args.only in (None, "h200"):
        shoot(_load(args.h200_results), args.out / "h200-report.png", args.max_height)
    if args.only in (None, "cpu"):
        if args.cpu_results is not None:
            shoot(_load(args.cpu_results), args.out / "cpu-report.png", args.max_height)
        else:
            with tempfile.TemporaryDirectory(prefix="bubblescope-cpu-") as tmp:
                shoot(_load(_cpu_run(Path(tmp) / "out")), args.out / "cpu-report.png", args.max_height)
    return 0


if __name__ == "__main__":
    sys.exit(main())
