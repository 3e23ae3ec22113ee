"""The README's picture of `mule serve`: a real server over a workdir, driven by headless
Chromium as a person uses it (a query typed, an image dropped on the page), one full-page
screenshot per query.

    python bench/serve_screenshot.py --workdir W [--dataset multi30k] --out docs \
        --query de="Ein Hund rennt über das Gras." --query cs="Dva psi si hrají ve sněhu." \
        --image photo.jpg

Each --query (lang=text) is typed and sent; the first screenshot (serve.png) also shows
--image dropped on the page (its sentences per language); the others are serve-<lang>.png.
Prints what the page showed (the detected language, the images ranked first, the dropped
image's best sentence per language), so a reader can check the picture against the log.
Needs Debian's chromium and Playwright (pip install -e '.[dev]').
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, server: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            sys.exit(f"mule serve exited with {server.returncode}:\n{server.stdout.read()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"mule serve did not answer {url} within {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--dataset")
    parser.add_argument("--query", action="append", required=True, help="lang=text (repeatable)")
    parser.add_argument("--image", help="an image file dropped on the page in the first screenshot")
    parser.add_argument("--out", default=".")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args()
    browser_path = os.environ.get("MULE_CHROMIUM") or shutil.which("chromium")
    if not browser_path:
        sys.exit("no chromium: apt-get install chromium (or set MULE_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    port = free_port()
    command = [sys.executable, "-m", "mule.commands", "serve", "--workdir", args.workdir, "--port", str(port)]
    command += ["--dataset", args.dataset] if args.dataset else []
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        wait_for(f"http://127.0.0.1:{port}/api/info", server)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=browser_path, headless=True, args=ARGS)
            page = browser.new_page(viewport={"width": args.width, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_function("document.getElementById('info').textContent.includes('images')")
            print("page:", page.text_content("#info").strip())
            for number, query in enumerate(args.query):
                lang, _, text = query.partition("=")
                page.fill("#q", text)
                page.press("#q", "Enter")
                page.wait_for_selector("#results figure", timeout=30_000)
                page.wait_for_function("document.getElementById('status').textContent.includes('detected')")
                page.wait_for_function("[...document.querySelectorAll('#results img')].every(i => i.complete && "
                                       "i.naturalWidth > 0)", timeout=30_000)  # fmt: skip
                shown = page.eval_on_selector_all("#results figure", "fs => fs.map(f => f.dataset.imageId)")
                print(f"{lang}: {text!r} -> {page.text_content('#status').strip()}; first: {', '.join(shown[:5])}")
                if number == 0 and args.image:
                    page.set_input_files("#file", args.image)
                    page.wait_for_selector("#sentences div li", timeout=30_000)
                    for block in page.locator("#sentences div[data-lang]").all():
                        print(f"  dropped {Path(args.image).name}: {block.get_attribute('data-lang')}: "
                              f"{block.locator('li').first.text_content().strip()}")  # fmt: skip
                name = "serve.png" if number == 0 else f"serve-{lang}.png"
                page.screenshot(path=str(out / name), full_page=True)
                print(f"wrote {out / name}")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=20)


if __name__ == "__main__":
    main()
