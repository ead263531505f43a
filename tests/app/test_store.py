"""The SQLite history: schema, edits, export, and crash safety (WAL, partial answers)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from phoenix_chat.app.store import SCHEMA_VERSION, Store, db_path, export_all

ROOT = Path(__file__).resolve().parents[2]


def test_wal_mode_and_schema_version(home):
    store = Store(home=home)
    assert store.journal_mode() == "wal"
    assert store.path == home / "history.sqlite3"
    store.close()
    db = sqlite3.connect(db_path(home))
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5


def test_a_chats_mode_is_kept_and_a_version_1_file_is_upgraded(home):
    """Completion or chat mode is per chat, saved with it; a history written before the mode
    existed (schema 1) gains the column and keeps its conversations, all on the model's default."""
    path = db_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,"
        " created_at REAL NOT NULL, updated_at REAL NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',"
        " sampling TEXT NOT NULL DEFAULT '{}');"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT NULL"
        " REFERENCES conversations(id) ON DELETE CASCADE, position INTEGER NOT NULL, role TEXT NOT NULL,"
        " content TEXT NOT NULL, complete INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL,"
        " stats TEXT NOT NULL DEFAULT '{}');"
        "INSERT INTO conversations (title, created_at, updated_at) VALUES ('old chat', 1, 1);"
        "PRAGMA user_version=1;"
    )
    old.close()
    s = Store(home=home)
    (conv,) = s.list_conversations()
    assert conv.title == "old chat" and conv.mode is None
    s.set_conversation_mode(conv.id, "chat")
    new = s.create_conversation("new")
    s.set_conversation_mode(new.id, "completion")
    with pytest.raises(ValueError):
        s.set_conversation_mode(new.id, "poem")
    s.close()
    again = Store(home=home)
    assert again.conversation(conv.id).mode == "chat" and again.conversation(new.id).mode == "completion"
    again.close()


def test_conversations_messages_edit_search_delete(home):
    s = Store(home=home)
    a = s.create_conversation("First", sampling={"temperature": 0.2})
    b = s.create_conversation("Second")
    u1 = s.add_message(a.id, "user", "hello there")
    s.add_message(a.id, "assistant", "hi")
    u2 = s.add_message(a.id, "user", "what is 100% of x_y?")
    s.add_message(a.id, "assistant", "x_y")
    assert [m.position for m in s.messages(a.id)] == [0, 1, 2, 3]
    assert [c.id for c in s.list_conversations("100%")] == [a.id]
    assert [c.id for c in s.list_conversations("second")] == [b.id]
    assert s.list_conversations("x%y") == []  # LIKE wildcards are escaped
    s.edit_message(u2.id, "changed")
    assert [(m.role, m.content) for m in s.messages(a.id)] == [
        ("user", "hello there"),
        ("assistant", "hi"),
        ("user", "changed"),
    ]
    s.truncate_after(u1.id, inclusive=True)
    assert s.messages(a.id) == []
    s.rename_conversation(b.id, "Renamed")
    assert s.conversation(b.id).title == "Renamed"
    assert s.conversation(a.id).sampling == {"temperature": 0.2}
    s.delete_conversation(a.id)
    assert s.conversation(a.id) is None
    assert [c.id for c in s.list_conversations()] == [b.id]


def test_export_all_json_and_markdown(home):
    s = Store(home=home)
    c = s.create_conversation("Greeting", system_prompt="Be brief.")
    s.add_message(c.id, "user", "Hi")
    s.add_message(c.id, "assistant", "Hello! ```code```")
    c2 = s.create_conversation("Other")
    s.add_message(c2.id, "user", "Second one")
    s.close()
    data = json.loads(export_all("json", home=home))
    assert [conv["title"] for conv in data["conversations"]] == ["Greeting", "Other"]
    assert data["conversations"][0]["messages"] == [
        {"role": "user", "content": "Hi", "complete": True},
        {"role": "assistant", "content": "Hello! ```code```", "complete": True},
    ]
    md = export_all("markdown", home=home)
    assert "# Greeting" in md and "## User\n\nHi" in md and "## Assistant\n\nHello!" in md
    assert "# Other" in md and "Second one" in md


def test_killed_writer_leaves_a_readable_file_with_the_partial_answer(home, tmp_path):
    """SIGKILL a process in the middle of saving a growing answer: the file stays intact."""
    script = textwrap.dedent(f"""
        from phoenix_chat.app.store import Store
        s = Store(home={str(home)!r})
        c = s.create_conversation("crash")
        s.add_message(c.id, "user", "tell me a long story")
        a = s.add_message(c.id, "assistant", "", complete=False)
        text = ""
        i = 0
        while True:
            i += 1
            text += f"word{{i}} "
            s.update_message(a.id, text, complete=False)
            if i == 200:
                print("saved", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "saved"
    proc.kill()
    proc.wait()
    db = sqlite3.connect(db_path(home))
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    content, complete = db.execute("SELECT content, complete FROM messages WHERE role = 'assistant'").fetchone()
    assert complete == 0
    assert content.startswith("word1 word2 ") and "word200 " in content


def test_store_thread_runs_the_stores_own_methods_on_its_thread(home, monkeypatch):
    import inspect
    import threading

    import phoenix_chat.app.store as store_module
    from phoenix_chat.app.store import StoreThread

    threads = []
    escape = store_module._escape_like
    monkeypatch.setattr(
        store_module, "_escape_like", lambda text: threads.append(threading.current_thread().name) or escape(text)
    )
    t = StoreThread(Store(home=home))
    try:
        conv = t.create_conversation("Typed", sampling={"top_k": 3})
        msg = t.add_message(conv.id, "assistant", "", complete=False)
        saved = t.update_message(msg.id, "partial answer", complete=False)  # queued, not waited for
        assert saved.result(timeout=10) is None
        assert [(m.content, m.complete) for m in t.messages(conv.id)] == [("partial answer", False)]
        assert [c.id for c in t.list_conversations("partial")] == [conv.id]
        assert threads and all(name.startswith("store") for name in threads)
        # the same names and signatures as Store: a typo is an AttributeError, not a string lookup
        assert inspect.signature(StoreThread.add_message) == inspect.signature(Store.add_message)
        with pytest.raises(AttributeError):
            t.mesages(conv.id)
    finally:
        t.close()
