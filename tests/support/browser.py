"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol with aiohttp, a
spillway dependency: no browser download, no driver binary, nothing from the network.

- `browser`: a fixture yielding a `Page` in a fresh Chromium with a profile of its own, killed
  when the test ends. It fails, never skips, when no Chromium is installed: scripts/test.sh
  installs it (CI runs that), and a browser test that is skipped proves nothing.
- `chromium_page()`: the same outside pytest (scripts/ui_screenshot.py).
- `Page`: `goto(url)`, `js(expression)` (its value), `text(selector)`, `all_text()` (iframes
  included), `click(selector)`, `click_label(text)`, `type(selector, text)` (focus, then
  keystrokes as text), `until(expression)` (a JS condition, with a generous deadline; what the
  page showed when it never held), `screenshot()`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.support.cli import free_ports
from tests.support.waiting import until

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # a closed network refuses the rest anyway
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
CHROMIUM_NAMES = ("chromium", "chromium-browser")


NO_CHROMIUM = "no Chromium here: `apt-get install -y chromium` (scripts/test.sh installs it)"


def chromium_path() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws, self._ids = ws, itertools.count(1)
        self._lock = asyncio.Lock()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        async with self._lock:  # one command at a time: answers are matched by id
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

    async def js(self, expression: str) -> Any:
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.until("document.readyState === 'complete'")

    async def text(self, selector: str = "body") -> str:
        found = await self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "return e ? e.innerText : ''; })()"
        )
        return str(found or "")

    async def all_text(self) -> str:
        """The page's text with its iframes' (the Temporal UI renders markdown in iframes)."""
        found = await self.js(
            "[document, ...[...document.querySelectorAll('iframe')].map(f => f.contentDocument)]"
            ".filter(d => d && d.body).map(d => d.body.innerText).join('\\n')"
        )
        return str(found or "")

    async def click_label(self, label: str) -> None:
        """Clicks the first tab, link or button whose text is `label`, if it is there yet."""
        await self.js(
            "(() => { const el = [...document.querySelectorAll('a,button,[role=tab]')]"
            f".find(e => e.innerText.trim() === {json.dumps(label)}); if (el) el.click(); }})()"
        )

    async def click(self, selector: str) -> None:
        """Clicks the element, which must be there (a button's click submits its form)."""
        clicked = await self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "if (!e) return false; e.click(); return true; })()"
        )
        assert clicked, f"nothing on the page matches {selector}"

    async def type(self, selector: str, text: str) -> None:
        await self.js(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.call("Input.insertText", text=text)

    async def until(self, expression: str, timeout_s: float = 120.0, what: str = "") -> Any:
        """The value of the JS `expression` once it is truthy."""

        async def read() -> Any:
            with contextlib.suppress(RuntimeError):  # the page is between two documents
                return await self.js(expression)
            return None

        try:
            return await until(read, timeout_s=timeout_s, every_s=0.2, what=what or expression)
        except AssertionError as failed:
            shown = await self.text()
            raise AssertionError(f"{failed}\nthe page showed:\n{shown}") from None

    async def screenshot(self) -> bytes:
        shot = await self.call("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])


@contextlib.asynccontextmanager
async def chromium_page(window: str = "1400,1200") -> AsyncIterator[Page]:
    """A page in a fresh headless Chromium of `window` pixels (width,height)."""
    chromium = chromium_path()
    if chromium is None:
        raise RuntimeError(NO_CHROMIUM)
    [port] = free_ports(1)
    profile = tempfile.mkdtemp(prefix="spillway-chromium-")
    browser = await asyncio.create_subprocess_exec(
        chromium, *CHROMIUM_FLAGS, f"--window-size={window}", f"--remote-debugging-port={port}",
        f"--user-data-dir={profile}", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:

            async def pages() -> list[dict[str, Any]]:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                        return [t for t in await response.json() if t["type"] == "page"]
                return []

            targets = await until(pages, timeout_s=60, what="Chromium's DevTools")
            url = targets[0]["webSocketDebuggerUrl"]
            async with http.ws_connect(url, max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Page.enable")
                await page.call("Runtime.enable")
                yield page
    finally:
        with contextlib.suppress(ProcessLookupError):
            browser.kill()
        await browser.wait()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
async def browser() -> AsyncIterator[Page]:
    if chromium_path() is None:
        pytest.fail(f"{NO_CHROMIUM}; the console's browser tests never skip")
    async with chromium_page() as page:
        yield page
