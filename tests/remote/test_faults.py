"""Faults a real server cannot be made to produce, from the named test double
(tests/remote/misbehaving_server.py), plus the real ones: a closed port, TLS failures (https://
to a plain-HTTP port, a self-signed certificate), an unknown host. Each is one line and a kind;
text that came before a fault is kept and the answer is marked "cut"."""

from __future__ import annotations

import functools
import socket
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from phoenix_chat.engine.remote.engine import RemoteDelta, RemoteEngine, RemoteError, RemoteTarget
from phoenix_chat.engine.sampling import SamplingParams

from .conftest import cli
from .fault_cases import (
    CLIENT_TIMEOUT_S,
    Fault,
    cases,
    closed_port,
    fault_url,
    self_signed_double,
    unaccepting_listener,
)
from .misbehaving_server import FORBIDDEN, MODEL, WORDS, MisbehavingServer

CHAT = [{"role": "user", "content": "Say hello"}]
PARAMS = SamplingParams(temperature=0.7, top_k=40, min_p=0.05, repetition_penalty=1.1, seed=7)


@pytest.fixture(scope="module")
def double():
    with MisbehavingServer(delay_s=3.0) as server:
        yield server


def engine(url: str, **kw) -> RemoteEngine:
    kw.setdefault("timeout_s", 5.0)
    return RemoteEngine(RemoteTarget(url, api_key=kw.pop("api_key", None)), **kw)


def answer(e: RemoteEngine, completion: bool = False, **kw) -> tuple[str, RemoteDelta, list[str]]:
    """(text, final delta, notices) of one streamed answer."""
    stream = e.stream_completion("Say", PARAMS, 16, **kw) if completion else e.stream_chat(CHAT, PARAMS, 16, **kw)
    deltas = list(stream)
    final = deltas[-1]
    assert final.finish_reason is not None and all(d.finish_reason is None for d in deltas[:-1])
    return "".join(d.text for d in deltas), final, [d.notice for d in deltas if d.notice]


def one_line(error: str | None) -> str:
    assert error and "\n" not in error and len(error) < 400, error
    return error


@pytest.mark.parametrize("completion", [False, True])
def test_a_whole_answer_from_the_double(double, completion):
    """The baseline the faults are measured against: the double's well-formed answer reads whole."""
    text, final, notices = answer(engine(double.url("ok")), completion)
    assert text == "".join(WORDS) and final.finish_reason == "stop" and not notices
    assert final.usage is not None and final.usage.counted_by_server and final.usage.completion_tokens == len(WORDS)
    assert final.usage.ttft_s is not None and final.usage.ttft_s > 0


def test_cut_mid_answer_keeps_the_text(double):
    text, final, _ = answer(engine(double.url("cut")))
    assert text == "".join(WORDS[:2])
    assert final.finish_reason == "cut" and "closed the connection" in one_line(final.error)
    assert final.usage is not None and final.usage.completion_tokens == 2 and not final.usage.counted_by_server


def test_a_clean_close_without_a_finish_is_a_cut(double):
    text, final, _ = answer(engine(double.url("eof")))
    assert text == "".join(WORDS[:2])
    assert final.finish_reason == "cut" and "ended before the answer did" in one_line(final.error)


@pytest.mark.parametrize("behaviour", ["malformed", "notachunk"])
def test_malformed_sse(double, behaviour):
    text, final, _ = answer(engine(double.url(behaviour)))
    assert "malformed" in one_line(final.error)
    assert (final.finish_reason, text) == (("cut", WORDS[0]) if behaviour == "malformed" else ("error", ""))


def test_an_error_event_mid_stream(double):
    text, final, _ = answer(engine(double.url("errorevent")))
    assert text == "".join(WORDS[:2]) and final.finish_reason == "cut"
    assert "the engine ran out of memory" in one_line(final.error)


def test_not_an_event_stream(double):
    text, final, _ = answer(engine(double.url("html")))
    assert (text, final.finish_reason) == ("", "error")
    assert "text/html, not an event stream" in one_line(final.error)


def test_429_retried_with_notices_then_answered(double):
    """Two 429s without Retry-After: exponential backoff from backoff_s, each wait a notice."""
    e = engine(double.url("busy-2-"), backoff_s=0.1)
    start = time.monotonic()
    text, final, notices = answer(e)
    assert text == "".join(WORDS) and final.finish_reason == "stop"
    assert notices == [
        f"127.0.0.1:{double.port} is busy (429): retrying in 0.1 s (retry 1 of 4)",
        f"127.0.0.1:{double.port} is busy (429): retrying in 0.2 s (retry 2 of 4)",
    ]
    assert time.monotonic() - start >= 0.3
    assert double.hits["busy-2-"] == 3


def test_429_honours_retry_after(double):
    e = engine(double.url("busy-1-1"), backoff_s=0.01)
    start = time.monotonic()
    text, final, notices = answer(e)
    assert final.finish_reason == "stop" and text == "".join(WORDS)
    assert notices == [f"127.0.0.1:{double.port} is busy (429): retrying in 1 s (retry 1 of 4)"]
    assert time.monotonic() - start >= 1.0


def test_429_gives_up_after_the_retries(double):
    e = engine(double.url("busy-99-0"), retries=2, backoff_s=0.01)
    text, final, notices = answer(e)
    assert len(notices) == 2 and (text, final.finish_reason) == ("", "error")
    assert one_line(final.error).endswith("is busy (429): the server is busy — gave up after 2 retries")
    assert final.error.startswith(f"127.0.0.1:{double.port}")


def test_429_asking_for_too_long_is_not_waited_for(double):
    e = engine(double.url("busy-99-3600"), backoff_s=0.01)
    start = time.monotonic()
    _, final, notices = answer(e)
    assert final.finish_reason == "error" and not notices and time.monotonic() - start < 2
    assert "asks to wait 3600 s; not retrying" in one_line(final.error)


def test_cancel_during_a_retry_wait(double):
    e = engine(double.url("busy-99-0"), backoff_s=5.0)
    start = time.monotonic()
    _, final, notices = answer(e, cancel=lambda: time.monotonic() - start > 0.3)
    assert final.finish_reason == "cancelled" and len(notices) == 1 and time.monotonic() - start < 2


def test_stop_while_the_server_sends_nothing_is_prompt(double):
    """Stop during a stall (as during a long prefill): the stream is closed at once, not when
    the server's next byte or the read timeout comes."""
    seen = []
    start = time.monotonic()

    def cancel() -> bool:
        return len(seen) >= 2 and time.monotonic() - start > 0.3

    for d in engine(double.url("stall"), timeout_s=30).stream_chat(CHAT, PARAMS, 16, cancel=cancel):
        seen.append(d)
    assert seen[-1].finish_reason == "cancelled" and seen[-1].error is None
    assert "".join(d.text for d in seen) == "".join(WORDS[:2])
    assert time.monotonic() - start < 1.5  # the double stalls for 3 s


def test_slow_headers_time_out(double):
    start = time.monotonic()
    _, final, _ = answer(engine(double.url("slow"), timeout_s=0.5))
    assert final.finish_reason == "error" and time.monotonic() - start < 2.5
    assert one_line(final.error) == f"127.0.0.1:{double.port} sent nothing for 0.5 s (timeout)"


def test_stop_before_the_headers_is_prompt(double):
    """The server has not answered yet (its headers come after 3 s): Stop ends the answer at once,
    and the request's thread closes the response when it comes (the server sees a disconnect)."""
    start = time.monotonic()
    _, final, _ = answer(engine(double.url("slow"), timeout_s=30), cancel=lambda: time.monotonic() - start > 0.3)
    assert final.finish_reason == "cancelled" and final.error is None
    assert time.monotonic() - start < 1.5


def test_a_stall_mid_stream_times_out_as_a_cut(double):
    text, final, _ = answer(engine(double.url("stall"), timeout_s=0.5))
    assert text == "".join(WORDS[:2]) and final.finish_reason == "cut"
    assert "sent nothing for 0.5 s" in one_line(final.error)


@pytest.mark.parametrize("key", [None, "sk-double-key"])
def test_403_a_key_without_the_permission(double, key):
    """The server lists its model but forbids answering with it (OpenAI's 403 for a key without the
    scope): one line with the server's words; the key, when one was sent, is not in it."""
    e = engine(double.url("forbidden"), api_key=key)
    assert e.check().startswith("OK")
    text, final, _ = answer(e)
    assert (text, final.finish_reason) == ("", "error")
    said = "the API key may not do this" if key else "no API key was sent"
    assert one_line(final.error) == f"127.0.0.1:{double.port} said 403 ({said}): {FORBIDDEN}"


def test_a_proxys_5xx_page(double):
    _, final, _ = answer(engine(double.url("gateway")))
    assert final.finish_reason == "error"
    assert one_line(final.error) == f"127.0.0.1:{double.port} failed: server error 502: 502 Bad Gateway"


def test_a_refused_extra_field_is_dropped_reported_once_and_not_sent_again(double):
    e = engine(double.url("strict"))
    before = len(double.seen)
    text, final, notices = answer(e)
    assert text == "".join(WORDS) and final.finish_reason == "stop"
    refused = ["top_k", "min_p", "repetition_penalty", "repeat_penalty"]
    assert e.unsupported_fields == set(refused)
    assert [n.split(":")[1].split(" does not take ")[1] for n in notices] == refused
    assert "Unrecognized request argument supplied: top_k" in notices[0]
    bodies = [s.body for s in double.seen[before:] if s.method == "POST"]
    assert [[f in b for f in refused] for b in bodies] == [
        [True, True, True, True],
        [False, True, True, True],
        [False, False, True, True],
        [False, False, False, True],
        [False, False, False, False],
    ]
    assert bodies[-1]["temperature"] == 0.7 and bodies[-1]["seed"] == 7 and bodies[-1]["max_tokens"] == 16
    # the next answer: no notice, the fields stay out
    text, final, notices = answer(e)
    assert final.finish_reason == "stop" and not notices
    assert not set(refused) & set(double.seen[-1].body)


def test_extra_fields_reach_the_server_in_the_body(double):
    answer(engine(double.url("ok")))
    body = double.seen[-1].body
    sampling = ("top_k", "min_p", "repetition_penalty", "repeat_penalty", "seed", "temperature", "top_p")
    assert {k: body[k] for k in sampling} == {
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "repeat_penalty": 1.1,
        "seed": 7,
        "temperature": 0.7,
        "top_p": 0.95,
    }
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["model"] == MODEL


def test_a_closed_port_is_unreachable():
    port = closed_port()
    e = engine(f"http://127.0.0.1:{port}")
    with pytest.raises(RemoteError) as err:
        e.check()
    assert err.value.kind == "unreachable"
    assert str(err.value) == f"cannot reach 127.0.0.1:{port}: connection refused (is the server running?)"
    _, final, _ = answer(e)
    assert final.finish_reason == "error" and final.error == str(err.value)


def test_a_connect_timeout():
    """A real listener whose accept queue is full (listen(0), never accepting): the kernel drops
    the next SYN, so the client's connect waits out its timeout."""
    with unaccepting_listener() as port:
        start = time.monotonic()
        with pytest.raises(RemoteError) as err:
            engine(f"http://127.0.0.1:{port}", timeout_s=1.0).models()
    assert err.value.kind == "timeout" and 0.9 < time.monotonic() - start < 5
    assert str(err.value) == f"cannot reach 127.0.0.1:{port}: no connection within 1 s"


def test_an_unknown_host_is_unreachable():
    with pytest.raises(RemoteError) as err:
        engine("http://no-such-host.invalid:8080", timeout_s=10).models()
    assert err.value.kind == "unreachable" and str(err.value).endswith("host name not found")


@pytest.fixture(scope="module")
def plain_http(tmp_path_factory):
    """The standard library's own HTTP server (a real one, not our double) on an empty folder."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path_factory.mktemp("www")))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join()


def test_https_to_a_plain_http_port_is_a_tls_failure(plain_http):
    e = engine(f"https://127.0.0.1:{plain_http}")
    with pytest.raises(RemoteError) as err:
        e.models()
    assert err.value.kind == "tls" and "is it a plain http:// server?" in one_line(str(err.value))


def test_a_self_signed_certificate_is_a_tls_failure(tmp_path):
    with self_signed_double(tmp_path) as tls_server:
        e = engine(tls_server.url("ok"))
        with pytest.raises(RemoteError) as err:
            e.check()
        _, final, _ = answer(e)
    assert err.value.kind == "tls" and "certificate is not trusted" in one_line(str(err.value))
    assert "self-signed certificate" in str(err.value)
    assert final.finish_reason == "error" and final.error == str(err.value)


def test_a_web_server_that_is_no_api_says_so(plain_http):
    with pytest.raises(RemoteError) as err:
        engine(f"http://127.0.0.1:{plain_http}/site").models()
    assert err.value.kind == "unreachable"
    assert one_line(str(err.value)) == (
        f"no OpenAI API at http://127.0.0.1:{plain_http}/site/v1 (404 on /site/v1/models): Error response"
    )


def test_not_a_server_address():
    with pytest.raises(RemoteError) as err:
        RemoteEngine(RemoteTarget("ftp://example.org"))
    assert err.value.kind == "unreachable" and "not a server address" in str(err.value)


def test_a_model_the_server_does_not_list(double):
    e = RemoteEngine(RemoteTarget(double.url("ok"), model="gpt-9"), timeout_s=5)
    with pytest.raises(RemoteError) as err:
        e.check()
    assert err.value.kind == "model"
    assert str(err.value) == f"127.0.0.1:{double.port} has no model 'gpt-9' (it serves: {MODEL})"
    _, final, _ = answer(e)
    assert final.finish_reason == "error" and final.error == str(err.value)


CLI_KEY = "sk-cli-fault-test-0b1d"  # sent with every CLI case: it must never show in the output


# the stall: test_cli_remote_timeout_is_what_the_engine_waits cuts it after 5 s, and the default it
# waits without the flag is checked below (waiting out the 60 s cost CI a minute)
@pytest.mark.parametrize("fault", cases(skip=("stall-90",)))
def test_cli_faults_are_one_line_and_exit_2(double, tmp_path, fault: Fault):
    """`run --remote` against each fault (fault_cases.py): exit 2, the text that came stays on
    stdout, and the fault is the one line on stderr."""
    with fault_url(fault, double, tmp_path) as (url, host):
        proc = cli("run", "--remote", url, "Say hello", env={"PHOENIX_CHAT_API_KEY": CLI_KEY}, timeout=300)
    assert proc.returncode == 2 and proc.stdout == fault.kept + "\n", (proc.stdout, proc.stderr)
    *figures, last = proc.stderr.splitlines()
    assert last.startswith("phoenix-chat: error: ")
    assert fault.matches(last.removeprefix("phoenix-chat: error: "), host), last
    if fault.kept:  # the figures of what came before the error
        (line,) = figures
        assert line.startswith(f"[remote {host} {MODEL}: ") and line.endswith("finish: cut]")
    else:
        assert figures == []
    assert CLI_KEY not in proc.stdout + proc.stderr


def test_cli_without_remote_timeout_waits_the_engines_default():
    """No --remote-timeout: the engine `run --remote` builds waits RemoteEngine's 60 s (the read
    timeout the stall fault's line names), through the same parser and builder as the process."""
    from phoenix_chat.app.cli import build_parser
    from phoenix_chat.app.remote_cli import remote_engine

    args = build_parser().parse_args(["run", "--remote", "http://127.0.0.1:9", "Say hello"])
    engine = remote_engine(args)
    assert args.remote_timeout is None and engine.timeout_s == CLIENT_TIMEOUT_S == 60
    args = build_parser().parse_args(["run", "--remote", "http://127.0.0.1:9", "--remote-timeout", "7", "Say hello"])
    assert remote_engine(args).timeout_s == 7


def test_cli_busy_is_retried_with_a_notice(double):
    busy = cli("run", "--remote", double.url("busy-1-0"), "Say hello")
    assert busy.returncode == 0 and busy.stdout == "".join(WORDS) + "\n"
    assert f"phoenix-chat: 127.0.0.1:{double.port} is busy (429): retrying in 1 s (retry 1 of 4)\n" in busy.stderr


def own_address() -> str | None:
    """This machine's address on its network (not loopback), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: the kernel picks the outgoing address
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def test_cli_warns_once_for_plain_http_to_another_machine():
    address = own_address()
    if address is None:
        pytest.skip("this machine has no network address other than loopback")
    with MisbehavingServer(host="0.0.0.0") as anywhere:
        proc = cli("chat", "--remote", anywhere.url("ok", host=address), input_text="hi\nhi again\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (
        f"phoenix-chat: warning: plain http:// to {address}:{anywhere.port}: prompts, answers and the API key "
        "travel unencrypted (use https://)\n"
    )
    assert proc.stdout.count("".join(WORDS)) == 2


@pytest.mark.parametrize("command", ["run", "chat"])
def test_cli_remote_timeout_is_what_the_engine_waits(double, command):
    """`--remote-timeout 5` against a server that stalls mid-answer: cut after 5 s (the default
    case above waits 60), the line says 5 s, and what came stays on stdout. `run` then exits 2;
    `chat` shows the cut under the answer and goes on to the next prompt."""
    args = ["--remote", double.url("stall-90"), "--remote-timeout", "5"]
    line = f"127.0.0.1:{double.port} sent nothing for 5 s (timeout)"
    start = time.monotonic()
    if command == "run":
        proc = cli("run", *args, "Say hello", timeout=120)
    else:
        proc = cli("chat", *args, input_text="Say hello\n", timeout=120)
    assert 4.5 < time.monotonic() - start < 30
    if command == "run":
        assert proc.returncode == 2 and proc.stdout == "".join(WORDS[:2]) + "\n", (proc.stdout, proc.stderr)
        assert proc.stderr.splitlines()[-1] == f"phoenix-chat: error: {line}", proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert f"> {''.join(WORDS[:2])}\n(cut: {line})\n" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--remote-timeout", "2"], "2 s: takes 5 to 3600 seconds"),
        (["--remote-timeout", "soon"], "'soon' is not a number of seconds"),
        (["--remote-timeout", "5000"], "5000 s: takes 5 to 3600 seconds"),
    ],
)
def test_cli_remote_timeout_out_of_range_is_refused(double, args, said):
    proc = cli("run", "--remote", double.url("ok"), *args, "hi", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == f"phoenix-chat run: error: argument --remote-timeout: {said}", proc.stderr


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("run", ["--remote-timeout", "30"]),
        ("run", ["--remote-model", "m"]),
        ("run", ["--api-key-env", "K"]),
        ("chat", ["--remote-timeout", "30"]),
    ],
)
def test_remote_flags_without_remote_are_refused_not_ignored(command, flag):
    """Without --remote this computer's engine would answer and the flag be ignored: refused."""
    proc = cli(command, *flag, *(["hi"] if command == "run" else []), input_text="", timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    name = flag[0]
    assert proc.stderr == f"phoenix-chat: error: {name}: for a remote server, give its URL with --remote\n"
