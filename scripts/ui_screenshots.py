"""Regenerate the web page's screenshots in docs/ui/ from real jobs on the real model pair.

Run by hand (not by CI): it takes minutes on a CPU.

    .venv/bin/python scripts/ui_screenshots.py            # writes docs/ui/{jobs,job,job-sparse,batch,workers,evidence}.png

What it does:
1. starts `specq up --detach` on the embedded default (SQLite job store, SQLAlchemy broker) in a
   temporary SPECQ_HOME on a free port; the models directory there links to the real one
   (`~/.cache/specq/models`, or --models), so the pair must be pulled first (`specq models pull`);
2. submits one job (examples/python-license.txt, "In what year did the Python core team move to
   BeOpen.com?") in the default mode, `auto` (README's first job: it runs baseline and says why), and a
   batch of the two files in examples/ with the questions of examples/README.md in mode specprefill
   (so the batch's pages show kept chunks), each with a short answer (--max-tokens, default 32), and
   waits for the answers;
3. drives Debian's Chromium through Playwright (tests/browser_helpers.py: no Playwright browser
   download, every request off 127.0.0.1 refused) at 1,280 px wide and screenshots the jobs list, the
   job's page (baseline), a batch job's page (specprefill: its kept chunks), the batch page, the workers page (while the batch runs: a busy slot) and the evidence
   page (/ui/evidence);
4. stops the service (`specq down`) and removes the temporary home.

Needs: the `chromium` package (or SPECQ_CHROMIUM), the playwright Python package (a dev dependency),
and fonts that draw the text: Debian's `fonts-noto-cjk` (the documents and answers can hold CJK and
other non-Latin text; without such fonts Chromium draws empty boxes). The script checks for a Noto
CJK font with `fc-list` and stops if there is none (--no-font-check skips that).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # browser_helpers: the same Chromium setup as the page's tests

from browser_helpers import browser, open_page  # noqa: E402

EXAMPLES = REPO / "examples"
JOB = ("python-license.txt", "In what year did the Python core team move to BeOpen.com?")
BATCH = [("python-license.txt", "Which company did the Python core team move to in 2000?"),
         ("textwrap.py", "What does dedent() do with lines that consist solely of whitespace?")]
WIDTH = 1280


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_fonts() -> None:
    try:
        out = subprocess.run(["fc-list", ":lang=ja", "family"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        out = ""
    if "Noto" not in out:
        sys.exit("ui_screenshots: no Noto CJK font found (fc-list :lang=ja). Install Debian's fonts-noto-cjk "
                 "(apt-get install fonts-noto-cjk) so Chromium draws the text, or pass --no-font-check.")


def specq(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("specq")
    cmd = [str(exe), *args] if exe.exists() else [sys.executable, "-m", "specq.cli", *args]
    return subprocess.run(cmd, env=env, check=check, text=True, capture_output=True)


def wait_done(client: httpx.Client, path: str, done: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        body = client.get(path).json()
        if body["status"] != last:
            print(f"  {path}: {body['status']}", flush=True)
            last = body["status"]
        if body["status"] in done:
            return body
        if time.monotonic() > deadline:
            sys.exit(f"ui_screenshots: {path} still {body['status']} after {timeout:.0f} s")
        time.sleep(2)


def shoot(b, url: str, ready: str, out: Path, full_page: bool, wait_for: str | None = None) -> None:
    p = open_page(b, width=WIDTH, height=900, timezone_id="UTC", locale="en-US")
    p.page.goto(url)
    p.wait_ready(ready, timeout_ms=60_000)
    if wait_for:
        p.page.wait_for_selector(wait_for, timeout=60_000, state="attached")
    p.page.wait_for_timeout(1500)  # one refresh more: the final numbers are drawn
    p.page.screenshot(path=str(out), full_page=full_page)
    p.assert_clean()
    print(f"  wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}", flush=True)
    p.page.context.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "ui", help="where the PNGs go (default docs/ui)")
    ap.add_argument("--models", type=Path, default=Path.home() / ".cache" / "specq" / "models",
                    help="the pulled models directory (default ~/.cache/specq/models)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="SPECQ_THREADS for the worker (default: specq's)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the answers")
    ap.add_argument("--no-font-check", action="store_true")
    args = ap.parse_args()
    if not args.no_font_check:
        check_fonts()
    if not args.models.is_dir():
        sys.exit(f"ui_screenshots: no models in {args.models}; run `specq models pull` first")
    args.out.mkdir(parents=True, exist_ok=True)

    home = Path(tempfile.mkdtemp(prefix="specq-shots-"))
    (home / "models").symlink_to(args.models.resolve())
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECQ_")}
    env.update(SPECQ_HOME=str(home), SPECQ_API_PORT=str(port), SPECQ_N_GPU_LAYERS="0", SPECQ_N_CTX="8192",
               PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    if args.threads:
        env["SPECQ_THREADS"] = str(args.threads)
    url = f"http://127.0.0.1:{port}"
    print(f"specq up --detach on {url} (SPECQ_HOME={home})", flush=True)
    up = specq(env, "up", "--detach", check=False)
    if up.returncode != 0:
        sys.exit(f"ui_screenshots: specq up failed:\n{up.stdout}{up.stderr}")
    try:
        params = {"mode": "specprefill", "max_tokens": args.max_tokens, "seed": 1}
        job_params = {"max_tokens": args.max_tokens, "seed": 1}  # mode auto, as README's first job
        with httpx.Client(base_url=url, timeout=60) as client:
            name, question = JOB
            r = client.post("/v1/jobs", json={"text": (EXAMPLES / name).read_text(), "question": question,
                                              "filename": name, "params": job_params})
            r.raise_for_status()
            job_id = r.json()["id"]
            lines = [json.dumps({"custom_id": n, "text": (EXAMPLES / n).read_text(), "question": q, "params": params})
                     for n, q in BATCH]
            r = client.post("/v1/batches", content="\n".join(lines).encode(),
                            headers={"content-type": "application/jsonl"})
            r.raise_for_status()
            batch_id = r.json()["id"]
            print(f"job {job_id}, batch {batch_id}: waiting for the answers", flush=True)
            job = wait_done(client, f"/v1/jobs/{job_id}", {"succeeded", "failed", "cancelled"}, args.timeout)
            if job["status"] != "succeeded":
                sys.exit(f"ui_screenshots: the job {job['status']}: {job.get('error')}")
            print(f"  answer: {(job.get('result') or {}).get('text')!r}", flush=True)
            with browser() as b:  # while the batch runs: a busy slot and its current job
                shoot(b, f"{url}/ui/workers", "workers", args.out / "workers.png", full_page=False)
            batch = wait_done(client, f"/v1/batches/{batch_id}", {"completed", "failed", "cancelled", "expired"},
                              args.timeout)
            if batch["status"] != "completed":
                sys.exit(f"ui_screenshots: the batch {batch['status']}")
            members = client.get("/v1/jobs", params={"batch_id": batch_id}).json()["data"]
            sparse_id = next((m["id"] for m in members if BATCH[0][0] in (m.get("custom_id"), m.get("filename"))),
                             members[0]["id"])
        with browser() as b:
            shoot(b, f"{url}/ui/jobs", "jobs", args.out / "jobs.png", full_page=False)
            shoot(b, f"{url}/ui/jobs/{job_id}", "job", args.out / "job.png", full_page=True,
                  wait_for="[data-role=kept]")  # baseline: what ran and why, no kept chunks
            shoot(b, f"{url}/ui/jobs/{sparse_id}", "job", args.out / "job-sparse.png", full_page=True,
                  wait_for="[data-role=doctext]")  # specprefill: the kept chunks of its document
            shoot(b, f"{url}/ui/batches/{batch_id}", "batch", args.out / "batch.png", full_page=True,
                  wait_for="[data-role=batch] [data-status=completed]")
            shoot(b, f"{url}/ui/evidence", "evidence", args.out / "evidence.png", full_page=True)
    finally:
        down = specq(env, "down", check=False)
        if down.returncode != 0:
            print(f"specq down: {down.stdout}{down.stderr}", file=sys.stderr)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
