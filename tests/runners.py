"""The SavedModel and HF artifacts of the suite's exports, validated by one long-lived runner
process per runtime and test worker (#36).

The exporter validates each artifact by starting keras_vit/export/runner.py in a new Python
process (keras_vit.export.validate.start_runner): for a SavedModel or an HF folder that process
imports TensorFlow or torch first, 5-7 s of each validation, ~30 of them in a run. Here that
command line goes to a process that imported its runtime once: like the runner, it loads the
runner file by path and never imports keras_vit, so an artifact still runs without the
exporting process's Python objects. TFLite's and ONNX's runners start in under a second and
keep a fresh process each; tests/test_export_artifacts.py keeps fresh processes for every
format (`fresh_runners`), as a user's export runs them.

    python tests/runners.py RUNNER_PY    (the server: one JSON command line per stdin line,
                                          one JSON answer {"returncode", "stderr"} per line)
"""

import json
import os
import select
import subprocess
import sys
import tempfile
import traceback

SERVED = ("saved_model", "hf")  # the runtimes whose import costs seconds
ENABLED = {"on": True}


class RunnerServer:
    """A server process (this file run as a script) and its pipes."""

    def __init__(self, runner: str, env):
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), runner], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        # (Its stderr is dropped, as run_fresh drops a fresh runner's start-up chatter: each
        # answer carries what Python wrote to stderr while it ran, a failure's traceback included.)

    def run(self, argv, timeout) -> subprocess.CompletedProcess:
        try:
            self.process.stdin.write(json.dumps(argv) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            line = ""
        else:
            ready, _, _ = select.select([self.process.stdout], [], [], timeout)
            if not ready:
                self.process.kill()
                self.process.wait()
                raise subprocess.TimeoutExpired(argv, timeout)
            line = self.process.stdout.readline()
        if not line:  # it died (a crash in a runtime): as a fresh process that died would
            return subprocess.CompletedProcess(argv, self.process.wait() or 1, "", "the runner process died")
        answer = json.loads(line)
        return subprocess.CompletedProcess(argv, answer["returncode"], "", answer["stderr"])

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()  # its loop ends and it exits normally (coverage writes its data)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def serve(start_runner):
    """A start_runner (keras_vit.export.validate's) that hands SERVED runtimes to a server per
    runtime; returns it and a function that stops the servers."""
    servers = {}

    def start(command, env, timeout):
        runtime = command[2]
        if not ENABLED["on"] or runtime not in SERVED:
            return start_runner(command, env, timeout)
        server = servers.get(runtime)
        if server is None or server.process.poll() is not None:
            server = servers[runtime] = RunnerServer(command[1], env)
        return server.run(command[2:], timeout)

    def stop():
        for server in servers.values():
            server.close()

    return start, stop


def _main(runner_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("keras_vit_export_runner", runner_path)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    # The answers go to a copy of stdout; file descriptor 1 itself (what a runtime's C++ code
    # prints to) becomes stderr's, so nothing but answers reaches the answer channel.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    saved_stderr = os.dup(2)
    for line in sys.stdin:
        # Each request's stderr, Python's and native code's alike, in a file of its own: what a fresh
        # runner's stderr would hold (loggers keep writing to file descriptor 2).
        with tempfile.TemporaryFile("w+") as errors:
            os.dup2(errors.fileno(), 2)
            try:
                returncode = runner.main(json.loads(line))
            except Exception:  # what a fresh process would die of, its traceback on stderr
                returncode = 1
                traceback.print_exc()
            sys.stderr.flush()
            os.dup2(saved_stderr, 2)
            errors.seek(0)
            text = errors.read()
        answers.write(json.dumps({"returncode": returncode, "stderr": text}) + "\n")
        answers.flush()


if __name__ == "__main__":
    _main(sys.argv[1])
