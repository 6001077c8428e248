"""A real headless browser for the web-page tests: Debian's Chromium driven by Playwright.

Playwright's own browser download is never used (`playwright install` fails on machines without the
internet): `executable_path` points at the system Chromium (`apt-get install chromium`, done by
.ci/run; SPECQ_CHROMIUM overrides the path). Chromium starts with `--no-sandbox` (CI runs as root)
and `--disable-background-networking` and friends: without them it keeps calling Google's hosts,
which a closed network refuses many times a second.

Every page opened here records what would make a test pass wrongly: script errors, console errors,
Content-Security-Policy violations, and every request that left 127.0.0.1 (`BrowserPage.offsite`),
which is aborted, so a page that needs the internet fails to draw.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-extensions"]
#: reported by a script the tests add (Playwright's init scripts run whatever the page's CSP says)
CSP_PROBE = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(e.violatedDirective + ' ' + (e.blockedURI || ''));
});
"""


def chromium_path() -> str | None:
    for candidate in (os.environ.get("SPECQ_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def require_browser() -> str:
    """The Chromium binary; without it (or the playwright package) the test skips, or fails where
    SPECQ_REQUIRE_BROWSER=1 (.ci/run sets it: CI must run the browser tests)."""
    import pytest

    missing = pytest.fail if os.environ.get("SPECQ_REQUIRE_BROWSER") == "1" else pytest.skip
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing("the playwright package is a dev dependency: pip install -e '.[dev]'")
    path = chromium_path()
    if path is None:
        missing("Chromium not installed (apt-get install -y chromium; .ci/run does it) or set SPECQ_CHROMIUM")
    return path


@dataclass
class BrowserPage:
    page: object
    errors: list[str] = field(default_factory=list)
    offsite: list[str] = field(default_factory=list)

    def csp_violations(self) -> list[str]:
        return self.page.evaluate("window.__cspViolations || []")

    def assert_clean(self) -> None:
        """No script error, no console error, no CSP violation, no request off this machine."""
        assert not self.errors, self.errors
        assert not self.offsite, f"requests off 127.0.0.1: {self.offsite}"
        assert not self.csp_violations(), self.csp_violations()

    def wait_ready(self, name: str, timeout_ms: float = 30_000) -> float:
        """Wait until the app says page `name` is drawn; its render time (ms since navigation start)."""
        self.page.wait_for_selector(f"html[data-ready='{name}']", timeout=timeout_ms, state="attached")
        return float(self.page.evaluate("window.specqRenderedAt || -1"))


@contextlib.contextmanager
def browser():
    """A headless Chromium (Playwright's Browser), closed afterwards."""
    from playwright.sync_api import sync_playwright

    path = require_browser()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_page(b, width: int = 1400, height: int = 1000, **context_options) -> BrowserPage:
    """A page in a fresh context (its own sessionStorage) that records errors and off-machine requests;
    `context_options` go to Playwright's new_context (e.g. timezone_id, locale)."""
    context = b.new_context(viewport={"width": width, "height": height}, **context_options)
    page = context.new_page()
    bp = BrowserPage(page)
    page.add_init_script(CSP_PROBE)
    page.on("pageerror", lambda e: bp.errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: bp.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)

    def guard(route):
        host = urlsplit(route.request.url).hostname or ""
        if route.request.url.startswith(("data:", "blob:")) or host in ("127.0.0.1", "localhost"):
            return route.continue_()
        bp.offsite.append(route.request.url)
        return route.abort()

    context.route("**/*", guard)
    return bp


__all__ = ["browser", "open_page", "BrowserPage", "require_browser", "chromium_path", "CHROMIUM_FLAGS"]
