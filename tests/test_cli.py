"""The `specq` command line as a person at a terminal and a script at a pipe see it.

* in process (typer's CliRunner, where stdout is not a terminal): every option's help is printed as
  written (no rich markup eats `[env SPECQ_…]`); lists are whole tab-separated lines or JSON; the
  client refuses a bad SPECQ_API_KEY / SPECQ_API_URL / id in one line; `run -` reads stdin; tenant
  names are matched whole;
* how user text reaches a terminal: rich tables and the result view print markup and escape
  sequences literally (a real rich Console that is a terminal);
* against a real `specq up` (API + worker on tiny models, SQLite + the embedded broker) in
  subprocesses, some under a pseudo-terminal: ids are percent-encoded into paths, `submit -`,
  `result --wait`, `specq batch`, piped lists, hostile file and batch names on a terminal, and
  `Retry-After` through a real HTTP proxy that answers 429.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import typer
from typer.testing import CliRunner

from specq.cli import app
from service_helpers import REPO, embedded_up, specq_cmd, wait_job

DOC = "def add(a, b):\n    return a + b\n"
#: a file name a terminal would obey if printed raw: clear screen, retitle, hyperlink, rich markup
HOSTILE_NAME = "evil[red]x[link=mailto:e@e.example]\x1b[2J\x1b]0;owned\x07\x1b]8;;mailto:e@e.example\x07.py"
HOSTILE_BATCH = "[/evil][link=https://e.example]x\x1b[31m\u202eexe.txt"
#: what rich itself writes on a terminal: SGR colour and style codes only
SGR = re.compile(r"\x1b\[[0-9;]*m")


def _cli(*args: str, input: str | bytes | None = None, env: dict | None = None):
    return CliRunner().invoke(app, list(args), input=input, env={"COLUMNS": "40", **(env or {})})


def _commands(group=None, prefix=()):
    """(path, click command) of every command of `specq`, groups included."""
    group = group or typer.main.get_command(app)
    yield prefix, group
    for name, sub in getattr(group, "commands", {}).items():
        yield from _commands(sub, prefix + (name,))


# --- help -----------------------------------------------------------------------------------------------

def test_help_of_every_command_prints_every_help_text_as_written():
    squeeze = lambda s: "".join(s.split())  # noqa: E731 - the help formatter wraps lines anywhere
    checked = 0
    for path, cmd in _commands():
        res = _cli(*path, "--help", env={"COLUMNS": "120"})
        assert res.exit_code == 0, (path, res.output)
        shown = squeeze(res.stdout)
        texts = [p.help for p in cmd.params if getattr(p, "help", None)] + [(cmd.help or "").split("\n\n")[0]]
        for text in texts:
            assert squeeze(text) in shown, (path, text, res.stdout)
            checked += 1
    assert checked > 150
    worker = squeeze(_cli("worker", "--help").stdout)
    assert "[envSPECQ_GPU]" in worker and "[envSPECQ_N_GPU_LAYERS]" in worker


def test_every_list_command_has_json():
    lists = {("jobs",), ("batches",), ("keys", "list"), ("models", "list"), ("status",), ("batch",), ("stats",),
             ("result",), ("run",), ("cancel",), ("cancel-batch",), ("down",)}
    found = {path for path, cmd in _commands() if any("--json" in getattr(p, "opts", ()) for p in cmd.params)}
    assert lists <= found, lists - found
    models = json.loads(_cli("models", "list", "--json").stdout)
    assert models["object"] == "list" and {m["role"] for m in models["data"]} == {"target", "speculator"}
    assert all(set(m) >= {"name", "size_bytes", "status", "sha256", "path"} for m in models["data"])


# --- output safety --------------------------------------------------------------------------------------

def _terminal_text(render, width: int = 200) -> str:
    """What `render(console)` writes to a rich Console that is a terminal, `width` columns wide."""
    from rich.console import Console

    buf = io.StringIO()
    render(Console(file=buf, force_terminal=True, color_system="truecolor", width=width))
    return buf.getvalue()


def _assert_inert(out: str) -> None:
    """Nothing but rich's own SGR styles in `out`: no escape sequence, BEL, C1 control or bidi override."""
    rest = SGR.sub("", out)
    assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", rest), repr(rest)


def test_tables_and_results_print_user_text_literally_on_a_terminal():
    from specq.cli.output import Column, print_table, safe
    from specq.cli.render import print_result

    assert safe("a\x1b[2Jb\tc\nd\x9b\u202e") == "a\\x1b[2Jb\\tc\\nd\\x9b\\u202e"
    assert safe("a\tb\r\nc\rd", lines=True) == "a\tb\r\nc\\rd"
    rows = [("job_" + "f" * 24, "[/evil]", HOSTILE_NAME), ("[bold]x[/bold]", "[link=https://e.example]click[/link]", "ok")]
    table = lambda con: print_table(["id", Column("name", fold=True), Column("file", fold=True)], rows,  # noqa: E731
                                    terminal=True, console=con)
    narrow = _terminal_text(table, width=30)
    _assert_inert(narrow)
    assert "job_" + "f" * 24 in SGR.sub("", narrow)  # the first column is never cut, even 30 columns wide
    out = _terminal_text(table)
    _assert_inert(out)
    plain = SGR.sub("", out)
    assert "[/evil]" in plain and "[bold]x[/bold]" in plain and "[link=https://e.example]click[/link]" in plain
    assert "\\x1b[2J" in plain.replace("\n", "").replace(" ", "")

    result = {"text": "answer [/x] \x1b]8;;https://e.example\x07link\x1b]8;;\x07 [link=https://e.example]y",
              "timings_ms": {"total": 1.0, "[/evil]\x1b[2J": 2.0}, "usage": {"prompt_tokens": "[/p]"},
              "spec": {"mode": "[red]m"}, "warnings": ["[/w] \x1b[5m"]}
    out = _terminal_text(lambda con: print_result(result, console=con))
    _assert_inert(out)
    plain = SGR.sub("", out)
    assert "answer [/x] \\x1b]8;;https://e.example\\x07link" in plain and "[/evil]\\x1b[2J" in plain
    assert "ran [red]m" in plain and "warning: [/w] \\x1b[5m" in plain


# --- the client, before any connection ----------------------------------------------------------------

def test_client_refuses_a_bad_key_url_or_id_in_one_line():
    url = "http://127.0.0.1:9"  # nothing listens: every check below comes before a connection
    cases = [
        (["jobs"], {"SPECQ_API_KEY": "sk-specq-caf\u00e9", "SPECQ_API_URL": url}, "SPECQ_API_KEY holds characters"),
        (["jobs"], {"SPECQ_API_KEY": "sk-specq-a\nb", "SPECQ_API_URL": url}, "SPECQ_API_KEY holds characters"),
        (["jobs"], {"SPECQ_API_URL": "localhost:8178"}, "must start with http:// or https://"),
        (["jobs"], {"SPECQ_API_URL": "http://[::1"}, "bad API URL"),
        (["status", ".."], {"SPECQ_API_URL": url}, "'..' is not an id"),
        (["cancel", "."], {"SPECQ_API_URL": url}, "is not an id"),
        (["status", "job_x"], {"SPECQ_API_URL": url}, "no specq API at"),
        # bytes of argv that are not UTF-8 (Python hands them over as lone surrogates)
        (["status", "job_\udcff"], {"SPECQ_API_URL": url}, "is not an id (it holds bytes that are not UTF-8)"),
        (["stats", "name\udcff"], {"SPECQ_API_URL": url}, "is not UTF-8 text"),
        (["submit", "missing\udcff.txt"], {"SPECQ_API_URL": url}, "file not found: missing\\udcff.txt"),
    ]
    for args, env, needle in cases:
        res = _cli(*args, env=env)
        assert res.exit_code == 1 and "Traceback" not in res.output, (args, res.output)
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (args, env, res.stderr)


def test_run_reads_the_document_from_stdin(tiny_models):
    res = _cli("run", "-", "-q", "What does add return?", "--max-tokens", "2", "--target", str(tiny_models.target),
               "--speculator", str(tiny_models.speculator), "--n-gpu-layers", "0", "--threads", "1", "--json",
               input=DOC.encode("utf-16"))  # stdin in UTF-16 with its BOM, as PowerShell pipes it
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["usage"]["prompt_tokens"] > len(DOC.split()) and result["usage"]["completion_tokens"] <= 2
    bad = _cli("run", "-", input=b"\x7fELF\x02\x01\x00\x00" * 4)
    assert bad.exit_code == 1 and bad.stderr.startswith("error: stdin looks binary")


class _NotSpecq(BaseHTTPRequestHandler):
    """Some other web server: JSON without specq's fields, or an HTML error page."""

    def do_GET(self):
        html = self.path.startswith("/v1/jobs/")
        body = b"<!DOCTYPE html><h1>nope</h1>\n" if html else b'{"hello": "world"}'
        self.send_response(404 if html else 200)
        self.send_header("Content-Type", "text/html" if html else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_that_is_not_specq_is_one_line():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotSpecq)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for args, needle in ((["jobs"], "answered JSON without data: is it a specq API?"),
                             (["batches", "--json"], "answered JSON without data"),
                             (["status", "job_x"], "Not Found (not a specq API error: is " + url + "/ a specq API?) (HTTP 404)")):
            res = _cli(*args, env={"SPECQ_API_URL": url})
            assert res.exit_code == 1 and res.stderr.count("\n") == 1 and needle in res.stderr, (args, res.output)
    finally:
        server.shutdown()
        server.server_close()


# --- keys (the job store directly) --------------------------------------------------------------------

def test_keys_list_piped_gives_whole_ids_that_revoke_takes(store):
    for tenant in ("team-with-a-rather-long-name-" + "x" * 30, "b"):
        assert _cli("keys", "create", "--tenant", tenant, "--name", "[/evil] \x1b[2J").exit_code == 0
    listed = _cli("keys", "list")  # 40 columns, stdout not a terminal
    assert listed.exit_code == 0, listed.output
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert len(rows) == 2 and all(len(r) == 7 for r in rows)
    assert rows[0][4] == "[/evil] \\x1b[2J"  # user text: escaped, one cell
    as_json = json.loads(_cli("keys", "list", "--json").stdout)
    assert [r[0] for r in rows] == [k["id"] for k in as_json["data"]]
    assert [r[3] for r in rows] == [k["prefix"] for k in as_json["data"]]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", r[5]) for r in rows), rows  # date and zone
    assert _cli("keys", "revoke", rows[0][0]).exit_code == 0
    assert _cli("keys", "revoke", rows[1][3]).exit_code == 0  # by the listed prefix, too
    assert _cli("keys", "list").stdout == ""


def test_tenant_names_are_matched_whole(store):
    from specq.storage.keys import check_tenant

    for bad in ("team-a\n", "team-a\r\n", "\nteam-a", "team a", "", "t" * 65, "team-\u00e4"):
        with pytest.raises(ValueError):
            check_tenant(bad)
        res = _cli("keys", "create", "--tenant", bad)
        assert res.exit_code == 1 and "bad tenant name" in res.stderr
        assert len(res.stderr.splitlines()) == 1  # the newline of the name is shown escaped
    assert check_tenant("team-a.b_c") == "team-a.b_c"
    assert _cli("keys", "list", "--json").stdout.count('"tenant"') == 0


# --- against a real service ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stack(tiny_models, tmp_path_factory):
    with embedded_up(tmp_path_factory.mktemp("cli_svc"), tiny_models) as st:
        yield st


@pytest.fixture
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        yield c


def _sh(stack, *args: str, input: bytes | None = None, url: str | None = None, cwd=None, **env):
    """`specq ARGS` in a subprocess, stdout a pipe."""
    e = dict(stack.env, SPECQ_API_URL=url or stack.url, COLUMNS="40", **env)
    return subprocess.run(specq_cmd(*args), env=e, cwd=cwd or REPO, input=input, capture_output=True, timeout=180)


def _on_terminal(stack, *args: str, cwd=None) -> str:
    """What `specq ARGS` writes to a terminal (a pseudo-terminal, 80 columns), stdout and stderr."""
    master, slave = pty.openpty()
    env = dict(stack.env, SPECQ_API_URL=stack.url, COLUMNS="80", TERM="xterm-256color")
    p = subprocess.Popen(specq_cmd(*args), env=env, cwd=cwd or REPO, stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    with contextlib.suppress(OSError):  # EIO once the child has closed its end
        while chunk := os.read(master, 65536):
            out += chunk
    os.close(master)
    assert p.wait(timeout=180) == 0, out.decode(errors="replace")
    return out.decode()


def test_ids_are_one_percent_encoded_path_segment(stack):
    for args in (["status", "../../metrics"], ["cancel", "../../metrics"], ["batch", "batch_../../../metrics"],
                 ["stats", "batch_../../healthz"], ["status", "job_x?limit=1"]):
        r = _sh(stack, *args)
        err = r.stderr.decode()
        assert r.returncode == 1 and "(HTTP 404)" in err and "non-JSON" not in err, (args, err)


def test_submit_from_stdin_then_result_wait(stack, client, tmp_path):
    r = _sh(stack, "submit", "-", "-q", "What does add return?", "--max-tokens", "3", input=DOC.encode())
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.decode().strip()
    assert job_id.startswith("job_") and "`specq result " + job_id + " --wait`" in r.stderr.decode()
    res = _sh(stack, "result", job_id, "--wait")
    assert res.returncode == 0, res.stderr
    assert "phases" in res.stdout.decode() and "sparse_prefill" in res.stdout.decode()
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["input"]["filename"] == "stdin"
    assert job["input"]["size_bytes"] == len(DOC.encode())
    as_json = _sh(stack, "result", job_id, "--wait", "--json")
    assert json.loads(as_json.stdout) == job["result"]

    # a batch of a file and stdin; `--jsonl -`
    (tmp_path / "b.py").write_text(DOC)
    r = _sh(stack, "submit", "b.py", "-", "-q", "q", "--max-tokens", "2", "--wait", input=b"x = 1\n", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    results = [json.loads(x) for x in _sh(stack, "results", r.stdout.decode().strip(), "-f", "jsonl").stdout.splitlines()]
    assert [x["custom_id"] for x in results] == ["b.py", "stdin"]
    lines = "".join(json.dumps({"custom_id": f"r{i}", "text": DOC, "question": "q"}) + "\n" for i in range(2))
    r = _sh(stack, "submit", "--jsonl", "-", "--max-tokens", "2", "--wait", input=lines.encode())
    assert r.returncode == 0 and r.stdout.decode().startswith("batch_"), r.stderr


def test_piped_lists_are_whole_tab_separated_lines_and_json_agrees(stack, client):
    job = client.post("/v1/jobs", json={"text": DOC, "question": "q\tand\nmore", "params": {"max_tokens": 2}}).json()
    wait_job(client, job["id"])
    batch = client.post("/v1/batches", files=[("file", ("[b].py", DOC.encode()))],
                        data={"metadata": json.dumps({"name": "tab\there"}), "params": json.dumps({"max_tokens": 2})}).json()
    for args in (["jobs"], ["batches"]):
        piped = _sh(stack, *args)  # 40 columns: a table would cut the ids
        assert piped.returncode == 0, piped.stderr
        rows = [line.split("\t") for line in piped.stdout.decode().splitlines()]
        listed = json.loads(_sh(stack, *args, "--json").stdout)
        assert listed["object"] == "list" and len(listed["data"]) >= 1
        assert [r[0] for r in rows] == [x["id"] for x in listed["data"]]
        assert len({len(r) for r in rows}) == 1  # tabs and newlines in cells are escaped: one line per row
    assert job["id"] in [line.split("\t")[0] for line in _sh(stack, "jobs").stdout.decode().splitlines()]
    assert f"{batch['id']}\ttab\\there\t" in _sh(stack, "batches").stdout.decode()


def test_batch_view(stack, client):
    name = f"view-{time.monotonic_ns()}"
    created = client.post("/v1/batches", files=[("file", ("a.py", DOC.encode())), ("file", ("b.py", DOC.encode()))],
                          data={"metadata": json.dumps({"name": name}), "params": json.dumps({"max_tokens": 2})}).json()
    deadline = time.monotonic() + 120
    while client.get(f"/v1/batches/{created['id']}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    view = _sh(stack, "batch", name)
    assert view.returncode == 0, view.stderr
    text = view.stdout.decode()
    assert text.startswith(f"{created['id']}  completed\n") and f"name        {name}" in text
    assert "2 total, 2 completed, 0 failed" in text and "completed   20" in text
    assert f"specq results {created['id']}" in text and f"GET {stack.url}/v1/batches/{created['id']}/results" in text
    as_json = json.loads(_sh(stack, "batch", created["id"], "--json").stdout)
    assert as_json == client.get(f"/v1/batches/{created['id']}").json()
    missing = _sh(stack, "batch", "no-such-batch-name")
    assert missing.returncode == 1 and "no batch 'no-such-batch-name'" in missing.stderr.decode()


def test_hostile_names_reach_a_terminal_inert(stack, client, tmp_path):
    (tmp_path / HOSTILE_NAME).write_text(DOC)
    r = _sh(stack, "submit", HOSTILE_NAME, "-q", "[/q]", "--max-tokens", "2", "--batch", HOSTILE_BATCH, "--wait",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    batch_id = r.stdout.decode().strip()
    job_id = json.loads(client.get(f"/v1/batches/{batch_id}/results").text.splitlines()[0])["id"]
    failing = client.post("/v1/jobs", json={"text": DOC * 400, "question": "q", "filename": HOSTILE_NAME,
                                            "params": {"max_tokens": 4000}}).json()  # fails: longer than the context
    assert wait_job(client, failing["id"])["status"] == "failed"
    for args in (["status", job_id], ["status", failing["id"]], ["jobs"], ["batches"], ["batch", batch_id],
                 ["results", batch_id], ["results", batch_id, "-f", "csv"], ["stats", batch_id], ["result", job_id]):
        out = _on_terminal(stack, *args)
        _assert_inert(out)
        plain = SGR.sub("", out).replace("\r\n", "\n")
        if args[0] == "batch":
            assert "[/evil][link=https://e.example]x\\x1b[31m\\u202eexe.txt" in plain, plain
        if args[0] == "batches":
            assert "[/evil]" in plain, plain  # the name column may fold: its whole text is checked above
        if args[0] == "status" or args[-1] == "csv":  # (a multipart upload sends BEL as %07: httpx encodes it)
            assert "\\x1b[2J\\x1b]0;owned" in plain.replace("\n", ""), (args, plain)
        if args == ["status", failing["id"]]:
            assert "\\x1b[2J\\x1b]0;owned\\x07\\x1b]8;;mailto" in plain and "exceeds the target's context" in plain
    # into a pipe the exported data is the API's, byte for byte
    csv = _sh(stack, "results", batch_id, "-f", "csv").stdout
    assert csv == client.get(f"/v1/batches/{batch_id}/results", params={"format": "csv"}).content


class _Limiter(BaseHTTPRequestHandler):
    """A rate-limiting proxy: the first `refusals` GETs answer 429 with `Retry-After: retry_after`,
    the rest go to the API."""

    upstream = ""
    refusals = 0
    retry_after = "1"
    seen: list = []

    def do_GET(self):
        cls = type(self)
        cls.seen.append((time.monotonic(), self.path))
        if cls.refusals > 0:
            cls.refusals -= 1
            body = b'{"error": {"message": "slow down", "type": "too_many_requests"}}'
            self.send_response(429)
            self.send_header("Retry-After", cls.retry_after)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        r = httpx.get(cls.upstream + self.path, timeout=30)
        self.send_response(r.status_code)
        self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    def log_message(self, *args):
        pass


def test_429_retry_after_is_waited_for(stack, client):
    job = client.post("/v1/jobs", json={"text": DOC, "question": "q", "params": {"max_tokens": 2}}).json()
    wait_job(client, job["id"])
    _Limiter.upstream, _Limiter.seen = stack.url, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Limiter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        _Limiter.refusals, _Limiter.retry_after = 2, "1"
        t0 = time.monotonic()
        r = _sh(stack, "result", job["id"], "--wait", "--json", url=proxy)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == client.get(f"/v1/jobs/{job['id']}").json()["result"]
        times = [t for t, _ in _Limiter.seen]
        assert len(times) == 3 and times[1] - times[0] >= 0.95 and times[2] - times[1] >= 0.95
        assert time.monotonic() - t0 >= 2

        # an HTTP date works too; a wait beyond the client's limit (30 s) is an error at once, not a hang
        _Limiter.refusals, _Limiter.retry_after, _Limiter.seen = 1, "Thu, 01 Jan 1970 00:00:00 GMT", []
        assert _sh(stack, "status", job["id"], url=proxy).returncode == 0 and len(_Limiter.seen) == 2
        _Limiter.refusals, _Limiter.retry_after, _Limiter.seen = 1, "120", []
        r = _sh(stack, "jobs", url=proxy)
        assert r.returncode == 1 and r.stderr.decode() == "error: slow down (HTTP 429; retry after 120 s)\n"
        assert len(_Limiter.seen) == 1
    finally:
        server.shutdown()
        server.server_close()


# --- what llama-server / vLLM users look for, and CLI details (issue 45, items 7 and 8) ------------------

def test_version_and_shell_completion():
    r = _cli("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"specq {__import__('specq').__version__}"
    shown = _cli("--help", env={"COLUMNS": "120"}).stdout
    assert "--install-completion" in shown and "--show-completion" in shown and "--version" in shown
    script = subprocess.run(specq_cmd("--show-completion", "bash"), capture_output=True, text=True, timeout=60,
                            env={**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert script.returncode == 0 and "_SPECQ_COMPLETE" in script.stdout, script.stdout + script.stderr


def test_submit_without_a_question_is_refused_and_wait_names_the_job(stack, client, tmp_path):
    (tmp_path / "a.py").write_text(DOC)
    for args in (["submit", "a.py"], ["submit", "a.py", "-q", "  "], ["submit", "a.py", "a.py", "--batch", "x"]):
        r = _sh(stack, *args, cwd=tmp_path)
        assert r.returncode == 1 and "-q QUESTION" in r.stderr.decode(), (args, r.stderr)
    r = _sh(stack, "submit", "a.py", "-q", "What does add return?", "--max-tokens", "2", "--wait", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    named = re.search(r"^job (job_\w+)$", r.stderr.decode(), re.M)
    assert named, r.stderr
    assert client.get(f"/v1/jobs/{named.group(1)}").json()["status"] == "succeeded"
    status = _sh(stack, "status", named.group(1)).stdout.decode()  # its times with a date and the zone
    for key in ("created", "started", "finished"):
        assert re.search(rf"^  {key} +\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", status, re.M), status
    r = _sh(stack, "submit", "a.py", "-q", "q", "--max-tokens", "2", "--wait", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    job = client.get(f"/v1/jobs/{out['job_id']}").json()
    assert {k: v for k, v in out.items() if k != "job_id"} == job["result"]


def test_batch_wait_prints_the_answers_on_a_terminal(stack, client, tmp_path):
    (tmp_path / "a.py").write_text(DOC)
    (tmp_path / "b.py").write_text("x = 1\n")
    out = SGR.sub("", _on_terminal(stack, "submit", "a.py", "b.py", "-q", "q", "--max-tokens", "2", "--wait",
                                   cwd=tmp_path)).replace("\r\n", "\n")
    batch_id = re.search(r"batch_\w+", out).group(0)
    assert "custom_id" in out and "answer" in out and "a.py" in out and "b.py" in out, out
    assert f"answers: `specq results {batch_id}`" in out.replace("\n", ""), out
    piped = _sh(stack, "submit", "a.py", "-q", "q", "--max-tokens", "2", "--batch", "p", "--wait", cwd=tmp_path)
    assert piped.returncode == 0 and re.fullmatch(r"batch_\w+\n", piped.stdout.decode()), piped.stdout
    assert "answers: `specq results" in piped.stderr.decode()


def test_piped_stats_has_a_header_and_phases_in_pipeline_order(stack, client, tmp_path):
    (tmp_path / "a.py").write_text(DOC)
    r = _sh(stack, "submit", "a.py", "-q", "q", "--max-tokens", "2", "--batch", "stats-order", "--wait", cwd=tmp_path)
    batch_id = r.stdout.decode().strip()
    piped = _sh(stack, "stats", batch_id)
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.decode().splitlines()
    assert lines[0] == "phase\tcount\tp50 ms\tp95 ms\tmean ms\tmax ms"
    phases = [line.split("\t")[0] for line in lines[1:]]
    order = ["tokenize", "cache_restore", "score", "speculator_prefill", "lookahead", "score_math", "select",
             "sparse_prefill", "ttft", "decode", "total"]
    known = [p for p in phases if p in order]
    assert known == sorted(known, key=order.index) and phases[-1] == "total", phases
    assert {"tokenize", "decode", "total"} <= set(phases)
    assert batch_id in piped.stderr.decode()  # the summary goes to stderr: stdout is the table alone


def test_cancel_cancel_batch_and_down_take_json(stack, client, tmp_path):
    # a long job holds the worker, so the next ones are still queued when they are cancelled
    blocker = client.post("/v1/jobs", json={"text": DOC, "question": "q",
                                            "params": {"max_tokens": 1500, "ignore_eos": True}}).json()
    job = client.post("/v1/jobs", json={"text": DOC, "question": "q", "params": {"max_tokens": 2}}).json()
    batch = client.post("/v1/batches", files=[("file", ("a.py", DOC.encode()))],
                        data={"question": "q", "params": json.dumps({"max_tokens": 2})}).json()
    r = _sh(stack, "cancel", job["id"], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["id"] == job["id"] and json.loads(r.stdout)["object"] == "job"
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"
    r = _sh(stack, "cancel-batch", batch["id"], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["id"] == batch["id"] and json.loads(r.stdout)["status"] in ("cancelling", "cancelled")
    assert _sh(stack, "cancel", blocker["id"], "--json").returncode == 0
    home = tmp_path / "nothing-up"
    r = _sh(stack, "down", "--json", SPECQ_HOME=str(home))
    assert r.returncode == 0 and json.loads(r.stdout) == {"stopped": False, "pid": None,
                                                          "detail": "nothing started with `specq up --detach`"}


def test_logs_show_the_api_request_lines_and_the_worker(stack, client):
    marker = f"/v1/jobs/job_{'a' * 20}{time.monotonic_ns() % 10000:04d}"
    assert client.get(marker).status_code == 404
    deadline = time.monotonic() + 10
    while True:
        r = _sh(stack, "logs", "api", "-n", "2000")
        assert r.returncode == 0, r.stderr
        if f'"GET {marker} HTTP/1.1" 404' in r.stdout.decode():
            break
        assert time.monotonic() < deadline, r.stdout.decode()[-2000:]
        time.sleep(0.2)
    worker = _sh(stack, "logs", "worker", "-n", "2000").stdout.decode()
    assert "celery" in worker.lower() or "worker" in worker.lower(), worker[-2000:]
    both = _sh(stack, "logs", "-n", "5").stdout.decode().splitlines()
    assert both and all(line.startswith(("api   | ", "worker| ")) for line in both), both
    assert _sh(stack, "logs", "nope").returncode == 1
    # -f: a new request's line arrives while it follows
    env = dict(stack.env, SPECQ_API_URL=stack.url)
    p = subprocess.Popen(specq_cmd("logs", "api", "-f", "-n", "0"), env=env, cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        time.sleep(2)
        second = marker + "x"
        client.get(second)
        line = b""
        deadline = time.monotonic() + 20
        while second.encode() not in line:
            assert time.monotonic() < deadline
            line = p.stdout.readline()
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_up_detach_logs_and_down_json(tiny_models, tmp_path):
    """`up --detach` writes its API's and worker's logs for `specq logs`; `down --json` says it stopped it."""
    from service_helpers import base_env, free_port

    port = free_port()
    env = dict(base_env(tmp_path, tiny_models, SPECQ_API_PORT=str(port)), SPECQ_API_URL=f"http://127.0.0.1:{port}")

    def sh(*args):
        return subprocess.run(specq_cmd(*args), env=env, cwd=REPO, capture_output=True, text=True, timeout=180)

    up = sh("up", "--detach")
    try:
        assert up.returncode == 0, up.stderr + (tmp_path / "up.log").read_text(errors="replace")[-3000:]
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code in (200, 503)
        deadline = time.monotonic() + 20
        while '"GET /health HTTP/1.1"' not in sh("logs", "api").stdout:
            assert time.monotonic() < deadline, sh("logs", "api", "-n", "100").stdout
            time.sleep(0.3)
        assert (tmp_path / "logs" / "worker.log").exists()
    finally:
        down = sh("down", "--json")
    assert down.returncode == 0, down.stderr
    out = json.loads(down.stdout)
    assert out["stopped"] is True and isinstance(out["pid"], int) and out["detail"].startswith("stopped")
    assert json.loads(sh("down", "--json").stdout)["stopped"] is False
