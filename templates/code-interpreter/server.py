#!/usr/bin/env python3
"""berth's code-interpreter server: the protocol @e2b/code-interpreter speaks
on port 49999, served over Jupyter kernels driven with jupyter_client.

  POST   /execute               {code, context_id?, language?, env_vars?}
                                -> newline-delimited JSON: stdout, stderr,
                                   result, error, number_of_executions,
                                   end_of_execution
  POST   /contexts              {language?, cwd?} -> {id, language, cwd}
  GET    /contexts              -> [{id, language, cwd}, ...]
  DELETE /contexts/{id}
  POST   /contexts/{id}/restart
  GET    /health

A context is one kernel. Each language has a default context, used when a
request names no context; the python one is started with the server so the
first runCode does not wait for a kernel. Executions in one context run one
at a time. Kernels talk to this server over Unix sockets (transport ipc),
not loopback TCP, so a memory checkpoint (CRIU, gVisor) sees no established
TCP connection and the kernels' state survives pause and resume.
"""

import json
import os
import queue
import re
import shutil
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client.manager import KernelManager

PORT = int(os.environ.get("BERTH_CODE_INTERPRETER_PORT", "49999"))
RUNTIME_DIR = os.environ.get("BERTH_CODE_INTERPRETER_DIR", "/tmp/berth-code-interpreter")
DEFAULT_CWD = os.environ.get("HOME", "/home/user")
MAX_BODY = 16 << 20  # bytes of a request body
# The sandbox's default environment (its create-time envVars), written by the
# host into the read-only channel dir and rewritten when a warm-pool member is
# claimed; the agent reads it on every exec, this server on every execution.
ENV_FILE = os.environ.get("BERTH_ENV_FILE", "/run/berth/env.json")
MAX_ENV_FILE = 1 << 20
KERNEL_START_TIMEOUT = 60.0

# language -> (kernel spec name, prefix that makes the kernel run the code
# in that language). bash runs through IPython's %%bash cell magic: a fresh
# bash per call, with the context's environment and working directory.
LANGUAGES = {
    "python": ("python3", ""),
    "bash": ("python3", "%%bash\n"),
}
ALIASES = {"py": "python", "python3": "python", "sh": "bash", "shell": "bash"}

# MIME type -> field of the SDK's Result.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}

def sandbox_env():
    """The sandbox's default environment from ENV_FILE ({} when absent or
    malformed): read per execution, so envVars given when a warm-pool member
    was claimed reach kernels that were started before the claim."""
    try:
        with open(ENV_FILE, "rb") as f:
            data = f.read(MAX_ENV_FILE + 1)
    except OSError:
        return {}
    if len(data) > MAX_ENV_FILE:
        return {}
    try:
        env = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(env, dict):
        return {}
    return {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str) and k and "=" not in k}


class HTTPError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def normalize_language(lang):
    lang = (lang or "python").strip().lower()
    lang = ALIASES.get(lang, lang)
    if lang not in LANGUAGES:
        raise HTTPError(404, "no kernel for language %r in this sandbox (available: %s)"
                        % (lang, ", ".join(sorted(LANGUAGES))))
    return lang


class Context:
    """One kernel and the lock that runs its executions one at a time."""

    def __init__(self, language, cwd, cid=None):
        self.id = cid or uuid.uuid4().hex
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.km = None
        self.kc = None
        self.ready = threading.Event()
        self.start_error = None
        self.applied_env = {}  # the sandbox env this kernel last took in
        self.start_env = {}  # ... and the one it was started with (a restart goes back to it)

    def json(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self):
        try:
            os.makedirs(RUNTIME_DIR, mode=0o700, exist_ok=True)
            spec, _ = LANGUAGES[self.language]
            km = KernelManager(kernel_name=spec, transport="ipc",
                               ip=os.path.join(RUNTIME_DIR, "k-" + self.id))
            km.connection_file = os.path.join(RUNTIME_DIR, "k-%s.json" % self.id)
            env = dict(os.environ)
            self.applied_env = sandbox_env()
            env.update(self.applied_env)
            self.start_env = self.applied_env
            # Figures inline (PNG + text), as in Jupyter; matplotlib is
            # imported on first use, not at kernel start.
            env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
            # No IPython history database: its per-cell SQLite write was a
            # third of a 1+1 round trip (execution counts are unaffected).
            km.start_kernel(cwd=self.cwd, env=env,
                            extra_arguments=["--HistoryManager.enabled=False"])
            kc = km.blocking_client()
            kc.start_channels()
            kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
            self.km, self.kc = km, kc
        except Exception as e:  # noqa: BLE001 - reported to every caller
            self.start_error = "kernel for %s did not start: %s" % (self.language, e)
            print(self.start_error, file=sys.stderr, flush=True)
        finally:
            self.ready.set()

    def _silent(self, code):
        if not code:
            return
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        self._wait_reply(msg_id, timeout=30)

    def _wait_reply(self, msg_id, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                msg = self.kc.get_shell_msg(timeout=left)
            except queue.Empty:
                return None
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg

    def wait_ready(self):
        if not self.ready.wait(KERNEL_START_TIMEOUT + 10):
            raise HTTPError(503, "kernel for %s is still starting" % self.language)
        if self.start_error:
            raise HTTPError(500, self.start_error)

    def restart(self):
        with self.lock:
            self.wait_ready()
            self.kc.stop_channels()
            self.km.restart_kernel(now=True)
            kc = self.km.blocking_client()
            kc.start_channels()
            kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
            self.kc = kc
            self.applied_env = self.start_env

    def shutdown(self):
        try:
            if self.kc is not None:
                self.kc.stop_channels()
            if self.km is not None:
                self.km.shutdown_kernel(now=True)
        except Exception as e:  # noqa: BLE001
            print("shutdown %s: %s" % (self.id, e), file=sys.stderr, flush=True)

    def execute(self, code, env_vars, emit):
        """Runs code, calling emit(dict) for every output; returns when the
        kernel is idle again. emit raising (the client went away) interrupts
        the kernel and drains its remaining output."""
        with self.lock:
            self.wait_ready()
            self._sync_sandbox_env()
            if env_vars:
                self._silent(
                    "import os as __berth_os\n"
                    "__berth_env_saved = {k: __berth_os.environ.get(k) for k in %r}\n"
                    "__berth_os.environ.update(%r)\n" % (list(env_vars), env_vars))
            try:
                self._run(LANGUAGES[self.language][1] + code, emit)
            finally:
                if env_vars:
                    self._silent(
                        "for __k, __v in __berth_env_saved.items():\n"
                        "    __berth_os.environ.pop(__k, None) if __v is None else __berth_os.environ.__setitem__(__k, __v)\n"
                        "del __berth_env_saved\n")

    def _sync_sandbox_env(self):
        """Applies changes of the sandbox's default environment to the
        kernel, for good (unlike a call's env_vars): the keys that changed
        since the kernel last took it in are set, the ones removed unset."""
        env = sandbox_env()
        if env == self.applied_env:
            return
        changed = {k: v for k, v in env.items() if self.applied_env.get(k) != v}
        removed = [k for k in self.applied_env if k not in env]
        self._silent(
            "import os as __berth_os\n"
            "__berth_os.environ.update(%r)\n"
            "for __k in %r:\n"
            "    __berth_os.environ.pop(__k, None)\n" % (changed, removed))
        self.applied_env = env

    def _run(self, code, emit):
        kc = self.kc
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        client_gone = False

        def send(obj):
            nonlocal client_gone
            if client_gone:
                return
            try:
                emit(obj)
            except (BrokenPipeError, ConnectionResetError, OSError):
                client_gone = True
                try:
                    self.km.interrupt_kernel()
                except Exception:  # noqa: BLE001
                    pass

        while True:
            try:
                msg = kc.get_iopub_msg(timeout=1.0)
            except queue.Empty:
                if not self.km.is_alive():
                    send({"type": "error", "name": "KernelDied", "value": "the kernel exited",
                          "traceback": "the kernel exited during the execution"})
                    break
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            now = time.time()
            if kind == "stream":
                send({"type": content.get("name", "stdout"), "text": content.get("text", ""),
                      "timestamp": now})
            elif kind in ("execute_result", "display_data"):
                send(result_message(content.get("data", {}), kind == "execute_result"))
            elif kind == "error":
                send({"type": "error", "name": content.get("ename", ""),
                      "value": content.get("evalue", ""),
                      "traceback": "\n".join(content.get("traceback", []))})
            elif kind == "execute_input":
                send({"type": "number_of_executions",
                      "execution_count": content.get("execution_count")})
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        self._wait_reply(msg_id, timeout=5)
        send({"type": "end_of_execution"})


def result_message(data, main):
    out = {"type": "result", "is_main_result": main}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            out[mime] = value
        elif field in ("png", "jpeg") and isinstance(value, str):
            out[field] = value.replace("\n", "")
        else:
            out[field] = value
    return out


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.default = {}  # language -> Context

    def create(self, language, cwd):
        ctx = Context(language, cwd or DEFAULT_CWD)
        with self.lock:
            self.by_id[ctx.id] = ctx
        ctx.start()
        return ctx

    def default_for(self, language):
        with self.lock:
            ctx = self.default.get(language)
            if ctx is not None:
                return ctx
            ctx = Context(language, DEFAULT_CWD, cid=language)
            self.by_id[ctx.id] = ctx
            self.default[language] = ctx
        threading.Thread(target=ctx.start, daemon=True).start()
        return ctx

    def get(self, cid):
        with self.lock:
            ctx = self.by_id.get(cid)
        if ctx is None:
            raise HTTPError(404, "context %s not found" % cid)
        return ctx

    def remove(self, cid):
        with self.lock:
            ctx = self.by_id.pop(cid, None)
            if ctx is not None:
                for lang, d in list(self.default.items()):
                    if d is ctx:
                        del self.default[lang]
        if ctx is None:
            raise HTTPError(404, "context %s not found" % cid)
        ctx.shutdown()

    def list(self):
        with self.lock:
            return [c.json() for c in self.by_id.values()]


CONTEXTS = Contexts()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "berth-code-interpreter/1"

    def log_message(self, fmt, *args):  # quiet; errors are logged where they happen
        pass

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > MAX_BODY:
            raise HTTPError(413, "request body over %d bytes" % MAX_BODY)
        if n == 0:
            return {}
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
        except ValueError as e:
            raise HTTPError(400, "body is not JSON: %s" % e)
        if not isinstance(body, dict):
            raise HTTPError(400, "body must be a JSON object")
        return body

    def _send(self, status, obj=None, text=None):
        if obj is not None:
            data = json.dumps(obj).encode()
            ctype = "application/json"
        else:
            data = (text or "").encode()
            ctype = "text/plain; charset=utf-8"
        self.send_response(status)
        if data or status != 204:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _dispatch(self, method):
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            if method == "GET" and path == "/health":
                return self._send(200, text="OK")
            if method == "POST" and path == "/execute":
                return self._execute(self._body())
            if path == "/contexts":
                if method == "POST":
                    body = self._body()
                    lang = normalize_language(body.get("language"))
                    ctx = CONTEXTS.create(lang, body.get("cwd"))
                    ctx.wait_ready()
                    return self._send(200, ctx.json())
                if method == "GET":
                    return self._send(200, CONTEXTS.list())
            m = re.fullmatch(r"/contexts/([A-Za-z0-9_-]+)(/restart)?", path)
            if m:
                cid, restart = m.group(1), m.group(2)
                if restart and method == "POST":
                    CONTEXTS.get(cid).restart()
                    return self._send(204)
                if not restart and method == "DELETE":
                    CONTEXTS.remove(cid)
                    return self._send(204)
            raise HTTPError(404, "no route %s %s" % (method, path))
        except HTTPError as e:
            self._send(e.status, text=e.message)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            try:
                self._send(500, text="internal error: %s" % e)
            except OSError:
                pass

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            raise HTTPError(400, "code: a string is required")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
            raise HTTPError(400, "env_vars: an object of strings is required")
        if body.get("context_id"):
            ctx = CONTEXTS.get(body["context_id"])
        else:
            ctx = CONTEXTS.default_for(normalize_language(body.get("language")))
        ctx.wait_ready()
        # Streamed: one JSON object a line, one chunk each, sent as it comes.
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(obj):
            line = (json.dumps(obj) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        ctx.execute(code, env_vars, emit)
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")


def main():
    shutil.rmtree(RUNTIME_DIR, ignore_errors=True)
    # The default python context starts with the server; requests wait for it.
    CONTEXTS.default_for("python")
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.allow_reuse_address = True
    srv = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    print("code interpreter listening on :%d" % PORT, file=sys.stderr, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
