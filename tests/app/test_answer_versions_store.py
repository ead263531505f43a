"""Earlier versions of a regenerated answer in SQLite: kept, switched, removed with their chat
or an edit, migrated into from a version-1 file, and exports hold only the version shown."""

from __future__ import annotations

import json
import sqlite3

from phoenix_chat.app.store import Store, db_path

# The schema as version 1 of the store wrote it (no versions table, no messages.version).
SCHEMA_V1 = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, system_prompt TEXT NOT NULL DEFAULT '', sampling TEXT NOT NULL DEFAULT '{}');
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL, role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL, complete INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}');
CREATE INDEX messages_by_conversation ON messages(conversation_id, position);
PRAGMA user_version=1;
"""


def versions_rows(home) -> int:
    return sqlite3.connect(db_path(home)).execute("SELECT COUNT(*) FROM message_versions").fetchone()[0]


def chat_with_two_versions(s: Store):
    c = s.create_conversation("Versions")
    s.add_message(c.id, "user", "Hi")
    a = s.add_message(c.id, "assistant", "first answer", stats={"generation_tokens": 2})
    new = s.add_version(a.id)  # Regenerate
    assert (new.id, new.content, new.complete, new.version, new.versions) == (a.id, "", False, 2, 2)
    s.update_message(a.id, "second answer", complete=True, stats={"generation_tokens": 5})
    return c, a


def test_regenerate_keeps_the_old_answer_and_switching_swaps_what_is_shown(home):
    s = Store(home=home)
    c, a = chat_with_two_versions(s)
    shown = s.messages(c.id)[1]
    assert (shown.content, shown.version, shown.versions, shown.stats) == (
        "second answer",
        2,
        2,
        {"generation_tokens": 5},
    )
    assert s.show_version(a.id, 1)
    shown = s.messages(c.id)[1]
    assert (shown.id, shown.content, shown.version, shown.versions) == (a.id, "first answer", 1, 2)
    assert shown.stats == {"generation_tokens": 2}  # each version keeps its own figures
    assert not s.show_version(a.id, 3) and not s.show_version(a.id, 1)  # no such version / already shown
    # a third version is numbered last, whichever one was shown
    third = s.add_version(a.id)
    assert (third.version, third.versions) == (3, 3)
    s.update_message(a.id, "third answer", complete=True)
    assert s.show_version(a.id, 2) and s.messages(c.id)[1].content == "second answer"
    # exports hold the version shown, and only it
    data = json.loads(s.export("json"))
    assert [m["content"] for m in data["conversations"][0]["messages"]] == ["Hi", "second answer"]
    md = s.export("markdown")
    assert "second answer" in md and "first answer" not in md and "third answer" not in md
    assert [conv.id for conv in s.list_conversations("second answer")] == [c.id]
    assert s.list_conversations("third answer") == []


def test_versions_go_with_their_chat_and_with_an_edit(home):
    s = Store(home=home)
    c, _ = chat_with_two_versions(s)
    assert versions_rows(home) == 1
    s.delete_conversation(c.id)
    assert versions_rows(home) == 0
    c, _ = chat_with_two_versions(s)
    first_user = s.messages(c.id)[0]
    s.edit_message(first_user.id, "Hello instead")  # edit-and-resend forgets the answers after it
    assert versions_rows(home) == 0 and [m.content for m in s.messages(c.id)] == ["Hello instead"]


def test_a_version_1_history_is_migrated_in_place(home):
    path = db_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = sqlite3.connect(path)
    old.executescript(SCHEMA_V1)
    old.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES ('Old', 1, 1)")
    old.execute(
        "INSERT INTO messages (conversation_id, position, role, content, created_at) VALUES (1, 0, 'user', 'Hi', 1)"
    )
    old.execute(
        "INSERT INTO messages (conversation_id, position, role, content, created_at) "
        "VALUES (1, 1, 'assistant', 'Hello', 1)"
    )
    old.commit()
    old.close()
    s = Store(home=home)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2
    msgs = s.messages(1)
    assert [(m.content, m.version, m.versions) for m in msgs] == [("Hi", 1, 1), ("Hello", 1, 1)]
    s.add_version(msgs[1].id)
    assert s.show_version(msgs[1].id, 1) and s.messages(1)[1].content == "Hello"
    s.close()
    assert Store(home=home).messages(1)[1].versions == 2  # opening it again migrates nothing twice
