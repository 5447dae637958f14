"""Opens a job in the Temporal Web UI (or any page, e.g. the studio console) in headless Chromium
(Debian's `chromium`), waits until the page shows the given text (the job's current details),
and saves a screenshot.

    .venv/bin/python scripts/ui_screenshot.py JOB_ID docs/ui-waiting-job.png \
        [--ui http://localhost:8233] [--expect "Waiting for approval"] [--click "User Metadata"]
    .venv/bin/python scripts/ui_screenshot.py http://127.0.0.1:8240/ docs/console.png \
        --expect "Awaiting approval"

Drives Chromium over the DevTools protocol with aiohttp (a spillway dependency): no browser
download, no npm. Exits 1 if the text never appears; prints the page's text around it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # this machine's closed network refuses the rest
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1440,1400",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws, self._ids = ws, itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        await self._ws.send_json({"id": message_id, "method": method, "params": params})
        async for message in self._ws:
            data = json.loads(message.data)
            if data.get("id") == message_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                result: dict[str, Any] = data.get("result", {})
                return result
        raise RuntimeError("Chromium closed the DevTools connection")

    async def click(self, label: str) -> None:
        """Clicks the first tab, link or button whose text is `label` (if it is there yet)."""
        script = (
            "(() => { const el = [...document.querySelectorAll('a,button,[role=tab]')]"
            f".find(e => e.innerText.trim() === {json.dumps(label)}); if (el) el.click(); }})()"
        )
        await self.call("Runtime.evaluate", expression=script)

    async def text(self) -> str:
        # The UI renders markdown (summary, details) in iframes: read those too.
        script = (
            "[document, ...[...document.querySelectorAll('iframe')].map(f => f.contentDocument)]"
            ".filter(d => d && d.body).map(d => d.body.innerText).join('\\n')"
        )
        result = await self.call("Runtime.evaluate", expression=script)
        return str(result.get("result", {}).get("value", ""))


async def screenshot(url: str, out: Path, expect: str, click: str | None, timeout_s: float) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium not found: apt-get install chromium")
    port = free_port()
    profile = tempfile.mkdtemp(prefix="spillway-chromium-")
    browser = await asyncio.create_subprocess_exec(
        chromium, *CHROMIUM_FLAGS, f"--remote-debugging-port={port}",
        f"--user-data-dir={profile}", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            targets: list[dict[str, Any]] = []
            for _ in range(100):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                        targets = [t for t in await response.json() if t["type"] == "page"]
                    if targets:
                        break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            async with http.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Page.enable")
                await page.call("Page.navigate", url=url)
                text = ""
                for _ in range(int(timeout_s / 0.5)):
                    if click is not None:
                        await page.click(click)
                    text = await page.text()
                    if expect in text:
                        break
                    await asyncio.sleep(0.5)
                else:
                    raise SystemExit(f"the page never showed {expect!r}; it showed:\n{text}")
                await asyncio.sleep(1)  # let the last layout settle
                shot = await page.call("Page.captureScreenshot", format="png")
                await asyncio.to_thread(_save, out, base64.b64decode(shot["data"]))
                return text
    finally:
        browser.terminate()
        await browser.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _save(path: Path, png: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("job_id", help="a job to show in the Temporal UI, or a page's URL")
    parser.add_argument("out", type=Path)
    parser.add_argument("--ui", default="http://localhost:8233")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--expect", default="Waiting for approval")
    parser.add_argument(
        "--click", help="tab to open first (a job's default: User Metadata; a URL's: none)"
    )
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args()
    page = args.job_id.startswith(("http://", "https://"))
    url = args.job_id if page else f"{args.ui}/namespaces/{args.namespace}/workflows/{args.job_id}"
    click = args.click if args.click or page else "User Metadata"
    text = asyncio.run(screenshot(url, args.out, args.expect, click, args.timeout))
    at = text.index(args.expect)
    print(f"saved {args.out}; the page shows:\n{text[max(0, at - 200) : at + 400]}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
