"""Screenshot of the desktop app mid-answer, under Xvfb, with the device gauges visible.

    python -m tools.screenshot [--out docs/screenshot.png] [--prompt TEXT] [--tokens N]

Starts a private Xvfb display, opens the real window (xcb platform) on the embedded model
with a throw-away PHOENIX_CHAT_HOME, sends a prompt, and captures the whole screen with
ImageMagick's `import -window root` once N tokens have streamed in (falls back to
QWidget.grab when `import` is missing). It also prints the start-up figures that
docs/PERFORMANCE.md reports: time to an interactive window, model load, first-token latency.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # before the Qt imports: start-up is measured from here

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

FIRST_PROMPT = "Write a Python function that adds two numbers."
PROMPT = "Here is a short poem about a phoenix rising from the ashes:"


def start_xvfb(size: str = "1400x900x24") -> tuple[subprocess.Popen, str]:
    for n in range(90, 120):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            proc = subprocess.Popen(
                ["Xvfb", f":{n}", "-screen", "0", size, "-nolisten", "tcp"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(100):
                if Path(f"/tmp/.X11-unix/X{n}").exists():
                    return proc, f":{n}"
                time.sleep(0.05)
            proc.kill()
    raise SystemExit("could not start Xvfb")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshot.png"))
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--tokens", type=int, default=30, help="capture after this many streamed deltas")
    ap.add_argument("--theme", default="light", choices=("light", "dark"))
    ap.add_argument("--json", help="also write the timings here")
    ap.add_argument(
        "--home",
        help="use this PHOENIX_CHAT_HOME (kept) instead of a throw-away one; "
        "a second run then measures a warm start (engine caches built)",
    )
    args = ap.parse_args()

    xvfb, display = start_xvfb()
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="phoenix-shot-"))
    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(DISPLAY=display, QT_QPA_PLATFORM="xcb", PHOENIX_CHAT_HOME=str(home))
    os.environ.pop("WAYLAND_DISPLAY", None)
    try:
        return run(args, home)
    finally:
        xvfb.terminate()
        xvfb.wait(5)
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)


def run(args, home: Path) -> int:
    from phoenix_chat.app.qt_compat import guard_singleton_refcounts

    guard_singleton_refcounts()
    import qasync
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from phoenix_chat.app.controllers.app_controller import AppController
    from phoenix_chat.app.settings import SettingsModel

    settings = SettingsModel(home)
    settings.set("theme", args.theme)
    settings.set("temperature", 0.0)
    settings.set("max_tokens", 40)
    app = QApplication([sys.argv[0]])
    app.setApplicationName("Phoenix Chat")
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    c = AppController(home)
    c.window.resize(1400, 900)
    c.show()
    c.window.move(0, 0)
    times: dict[str, float] = {}
    state = {"deltas": 0, "phase": "first"}

    def interactive():
        times["window_interactive_s"] = time.perf_counter() - T0

    QTimer.singleShot(0, interactive)

    def on_model(info):
        times.setdefault("model_ready_s", time.perf_counter() - T0)
        times.setdefault("model_load_in_worker_s", info.get("load_s", 0.0))
        if state["phase"] == "first":
            state["phase"] = "warm"
            c.chat.set_chat_settings("", {**c.settings.values.sampling_defaults(), "max_tokens": 24})
            c.chat.send(FIRST_PROMPT)

    def on_finished(_mid, _reason):
        if state["phase"] == "warm":
            state["phase"] = "shot"
            c.chat.new_conversation()
            c.chat.set_chat_settings("", {**c.settings.values.sampling_defaults(), "max_tokens": 60})
            c.window.chat.input.setPlainText(args.prompt)
            state["sent_at"] = time.perf_counter()
            c.window.chat._on_submit()

    def on_tokens(_gid, _text):
        if state["phase"] == "warm" and "first_answer_first_token_s" not in times:
            times["first_answer_first_token_s"] = time.perf_counter() - T0
        if state["phase"] != "shot":
            return
        state["deltas"] += 1
        if state["deltas"] == 1:
            times["first_token_latency_s"] = time.perf_counter() - state["sent_at"]
        if state["deltas"] == args.tokens:
            QTimer.singleShot(150, capture)  # let the view render the last delta

    def capture():
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if shutil.which("import"):
            subprocess.run(["import", "-window", "root", str(out)], check=True)
        else:
            c.window.grab().save(str(out))
        print(f"wrote {out}")
        c.window.close()
        app.quit()

    def on_stats(_gid, stats):
        if state["phase"] == "shot" and stats.ttft_s is not None:
            times["engine_ttft_s"] = stats.ttft_s
            times["prompt_tokens"] = stats.prompt_tokens
            times["generation_tps"] = stats.generation_tps

    c.models.model_ready.connect(on_model)
    c.chat.answer_finished.connect(on_finished)
    c.worker.tokens_changed.connect(on_tokens)
    c.worker.stats_changed.connect(on_stats)
    QTimer.singleShot(600_000, app.quit)
    with loop:
        loop.run_forever()
    c.shutdown()
    info = c.models.info or {}
    times["backend"] = f"{info.get('backend', '?')} on {info.get('device', '?')}"
    print(json.dumps(times, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(times, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
