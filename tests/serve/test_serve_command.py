"""``anyfp4 serve``'s command line: what it checks before the weights, what it hands the server (name, key,
hosts), the warning for an open address without a key, and its exit codes."""

import signal
import socket

import pytest

import anyfp4.serve.app as app_module
from anyfp4.cli import main
from anyfp4.serve.guards import LOOPBACK_NAMES
from anyfp4.serve.server import is_loopback
from helpers import free_port


@pytest.fixture
def no_weights_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr("anyfp4.runtime.loader.build_model", refuse)


@pytest.fixture
def started(monkeypatch):
    """Instead of serving: what the command built (create_app's arguments), and a signal to end with."""
    seen = {"stopped_by": None}

    def create_app(worker, name, api_key=None, max_tokens_limit=1024, **options):
        seen.update(worker=worker, name=name, api_key=api_key, max_tokens_limit=max_tokens_limit, **options)
        return object()

    def serve(app, worker, sock, quiet=False):
        seen["socket"] = sock.getsockname()
        return seen["stopped_by"]

    monkeypatch.setattr(app_module, "create_app", create_app)
    monkeypatch.setattr("anyfp4.serve.server.serve", serve)
    return seen


def test_a_port_in_use_fails_before_the_weights(checkpoint, no_weights_read, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(checkpoint), "--port", str(port), "--device", "cpu", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("anyfp4 serve: error: ") and "in use" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, code, fragment", [
    (["--api-key", " "], 2, "--api-key is empty"),
    (["--device", "tpu"], 2, "unknown device 'tpu'"),
    (["--port", "70000"], 2, "must be a port number from 1 to 65535"),
    (["--max-queue", "0"], 2, "must be an integer >= 1"),
])
def test_bad_options_are_one_line_errors(checkpoint, no_weights_read, capsys, argv, code, fragment):
    assert main(["serve", str(checkpoint), "--port", str(free_port()), *argv]) == code
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err


def test_a_missing_checkpoint_is_a_usage_error(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nowhere"), "--port", str(free_port())]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_without_the_serve_extra_it_says_what_to_install(checkpoint, no_weights_read, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    assert main(["serve", str(checkpoint)]) == 1
    assert "needs uvicorn: pip install 'anyfp4[serve]'" in capsys.readouterr().err


def test_defaults_loopback_hosts_and_the_key_from_the_environment(checkpoint, started, monkeypatch, capsys):
    monkeypatch.setenv("ANYFP4_API_KEY", " from-env \n")
    port = free_port()
    assert main(["serve", str(checkpoint), "--port", str(port), "--device", "cpu", "--quiet"]) == 0
    assert started["name"] == "tiny" and started["api_key"] == "from-env" and started["max_tokens_limit"] == 1024
    assert started["allowed_hosts"] == LOOPBACK_NAMES | {"127.0.0.1"}
    assert started["socket"] == ("127.0.0.1", port)
    assert started["worker"].session.model is not None
    err = capsys.readouterr().err
    assert "warning" not in err and f"tiny (cpu, float32) on http://127.0.0.1:{port}/v1, API key required" in err


def test_an_open_address_without_a_key_is_warned_about(checkpoint, started, monkeypatch, capsys):
    monkeypatch.delenv("ANYFP4_API_KEY", raising=False)
    argv = ["serve", str(checkpoint), "--host", "0.0.0.0", "--port", str(free_port()), "--device", "cpu", "--quiet",
            "--served-model-name", "my-model", "--max-tokens-limit", "77"]
    assert main(argv) == 0
    assert started["allowed_hosts"] is None and started["api_key"] is None
    assert (started["name"], started["max_tokens_limit"]) == ("my-model", 77)
    assert "warning: listening on 0.0.0.0 without an API key" in capsys.readouterr().err
    assert main([*argv, "--api-key", "k"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("signum, code, line", [(signal.SIGTERM, 143, "anyfp4 serve: terminated"),
                                                (signal.SIGINT, 130, "anyfp4 serve: interrupted")])
def test_a_signal_that_stopped_the_server_gives_the_commands_exit_code(checkpoint, started, capsys, signum, code,
                                                                       line):
    started["stopped_by"] = signum
    assert main(["serve", str(checkpoint), "--port", str(free_port()), "--device", "cpu", "--quiet"]) == code
    assert capsys.readouterr().err.splitlines()[-1] == line


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("0.0.0.0", False), ("192.168.1.4", False),
                                            ("example.com", False), ("::", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) == loopback
