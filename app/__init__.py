"""Phoenix Chat's user-facing side: the CLI (`cli.py`, `terminal_chat.py`) and the desktop app.

Desktop app map (PySide6 + qasync; the engine runs in another process and never sees Qt):

    gui.py               run_gui() / display_available(): what `phoenix-chat` calls
    worker/process.py    the engine worker process: load, generate, cancel flags, stats
    worker/protocol.py   the message names (*_requested commands, *_changed events)
    worker/client.py     GUI side of the pipe: reader thread → asyncio queue → Qt signals
    controllers/         app (wiring, theme), model (menus ↔ settings ↔ loads), chat
                         (conversations, answers, persistence), gauges (3 Hz sampling);
                         wiring.py: signal → slot tables the controllers share
    views/               widgets only: main window + menus, chat pane, list, device panel
    gauges/              amdgpu sysfs reader, psutil, engine/NPU figures → one Snapshot
    store.py             SQLite history (WAL), export_all(); settings.py: typed settings
    qt_compat.py         guard for a PySide6 6.12 reference-count bug on Python 3.11

One token on its way to the screen: engine `stream_generate` (worker main thread) → deltas
coalesced to ≤ 33 messages/s → pipe → reader thread → asyncio queue → `tokens_changed`
signal → ChatController (text kept, saved every 0.5 s on the store thread) → ChatView
redraws the last message at ≤ 15 Hz.
"""
