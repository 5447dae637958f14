"""Opens a job in the Temporal Web UI (or any page, e.g. the studio console) in headless Chromium
(Debian's `chromium`), waits until the page shows the given text (the job's current details),
and saves a screenshot.

    .venv/bin/python scripts/ui_screenshot.py JOB_ID docs/ui-waiting-job.png \\
        [--ui http://localhost:8233] [--expect "Waiting for approval"] [--click "User Metadata"]
    .venv/bin/python scripts/ui_screenshot.py http://127.0.0.1:8240/ docs/console.png \\
        --expect "Awaiting approval"

Drives Chromium over the DevTools protocol as the browser tests do (tests/support/browser.py):
no browser download, no npm. Exits 1 if the text never appears; prints the page's text around it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.browser import chromium_page


async def screenshot(url: str, out: Path, expect: str, click: str | None, timeout_s: float) -> str:
    async with chromium_page(window="1440,1400") as page:
        await page.call("Page.navigate", url=url)
        text = ""
        for _ in range(int(timeout_s / 0.5)):
            if click is not None:
                await page.click_label(click)
            text = await page.all_text()
            if expect in text:
                break
            await asyncio.sleep(0.5)
        else:
            raise SystemExit(f"the page never showed {expect!r}; it showed:\n{text}")
        await asyncio.sleep(1)  # let the last layout settle
        png = await page.screenshot()
        await asyncio.to_thread(_save, out, png)
        return text


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
    try:
        text = asyncio.run(screenshot(url, args.out, args.expect, click, args.timeout))
    except RuntimeError as failed:  # no Chromium, or it closed the DevTools connection
        raise SystemExit(str(failed)) from None
    at = text.index(args.expect)
    print(f"saved {args.out}; the page shows:\n{text[max(0, at - 200) : at + 400]}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
