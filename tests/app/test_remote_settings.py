"""Remote engines (issue 21), the parts with no server: saved profiles in settings (never a key),
API keys in the keyring or for the session only, and which engine wrote each answer (store schema 4,
migrated from a schema-3 file).

The keyring tests use keyring's own plugin API: `MemoryKeyring` below is a `KeyringBackend` that
keeps passwords in a dict (this machine has no Secret Service; `keyring.get_keyring()` here is
keyring's `fail.Keyring`, which the session-only path is tested against as it is)."""

from __future__ import annotations

import json
import sqlite3

import keyring
import keyring.backend
import keyring.errors
import pytest
from keyring.backends import fail

from phoenix_chat.app.secrets import SERVICE, SecretStore
from phoenix_chat.app.settings import SettingsModel
from phoenix_chat.app.store import SCHEMA_VERSION, Store, db_path

KEY = "sk-remote-test-4f9c2e77"


class MemoryKeyring(keyring.backend.KeyringBackend):
    """A keyring backend holding passwords in memory (keyring's plugin API)."""

    priority = -1  # type: ignore[assignment]  # never picked by keyring itself: only where a test passes it

    def __init__(self) -> None:
        super().__init__()
        self.passwords: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.passwords.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.passwords[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.passwords.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError("no such password")


class LockedKeyring(MemoryKeyring):
    """A keyring that refuses to store (a locked collection, a denied prompt)."""

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.PasswordSetError("the collection is locked")


# -- settings ---------------------------------------------------------------------------------
def test_profiles_are_saved_without_a_key_and_the_engine_choice_persists(home):
    model = SettingsModel(home)
    assert model.values.engine == "local" and model.values.remote() is None
    model.save_remote_profile({"name": "workstation", "url": "http://10.0.0.5:8000", "model": None})
    model.save_remote_profile({"name": "cluster", "url": "https://llm.example/v1", "model": "gemma-3-27b"})
    model.set("remote_profile", "cluster")
    model.set("engine", "remote")
    with pytest.raises(ValueError):  # a key is never a settings field
        model.save_remote_profile({"name": "x", "url": "http://h", "model": None, "api_key": KEY})
    with pytest.raises(ValueError):
        model.set("engine", "cloud")
    # editing one in place (renamed) keeps its position
    model.save_remote_profile({"name": "ws", "url": "http://10.0.0.5:8001", "model": "m"}, replacing="workstation")
    again = SettingsModel(home).values
    assert [p["name"] for p in again.remote_profiles] == ["ws", "cluster"]
    assert again.engine == "remote" and again.remote() == {
        "name": "cluster",
        "url": "https://llm.example/v1",
        "model": "gemma-3-27b",
        "timeout_s": 60.0,  # saved without one: the engine's default
    }
    SettingsModel(home).remove_remote_profile("cluster")  # the one in use: back to this computer
    after = SettingsModel(home).values
    assert (
        after.engine == "local"
        and after.remote_profile is None
        and [p["name"] for p in after.remote_profiles] == ["ws"]
    )


def test_a_profile_keeps_its_read_timeout_and_older_files_get_the_default(home):
    model = SettingsModel(home)
    model.save_remote_profile({"name": "cpu-box", "url": "http://10.0.0.7:8080", "model": None, "timeout_s": 900.0})
    assert SettingsModel(home).values.remote_profiles[0]["timeout_s"] == 900.0
    for bad in (0, 4.9, 3601, "60", True, None):  # outside READ_TIMEOUT_RANGE_S, or not a number
        with pytest.raises(ValueError):
            model.save_remote_profile({"name": "x", "url": "http://h", "model": None, "timeout_s": bad})
    # a settings file written before the timeout was a setting: its profiles read with the default
    data = json.loads(model.path.read_text())
    data["remote_profiles"] = [{"name": "old", "url": "http://h:1", "model": "m"}]
    model.path.write_text(json.dumps(data))
    assert SettingsModel(home).values.remote_profiles == [
        {"name": "old", "url": "http://h:1", "model": "m", "timeout_s": 60.0}
    ]


def test_a_hand_edited_key_in_the_settings_file_is_not_read(home):
    model = SettingsModel(home)
    data = json.loads(model.path.read_text()) if model.path.exists() else {}
    data["remote_profiles"] = [{"name": "a", "url": "http://h:1", "model": None, "api_key": KEY}]
    model.path.write_text(json.dumps(data))
    assert SettingsModel(home).values.remote_profiles == []  # refused whole, not half-read


# -- secrets ----------------------------------------------------------------------------------
def test_keys_go_to_the_keyring_and_never_to_the_settings_file(home):
    backend = MemoryKeyring()
    secrets = SecretStore(backend)
    assert secrets.persistent and secrets.problem is None
    secrets.set("workstation", KEY)
    assert backend.passwords == {(SERVICE, "workstation"): KEY}
    assert SecretStore(backend).get("workstation") == KEY  # outlives the session (a new store reads it)
    secrets.rename("workstation", "ws")
    assert backend.passwords == {(SERVICE, "ws"): KEY}
    secrets.set("ws", "")  # an empty key forgets it
    assert backend.passwords == {} and secrets.get("ws") is None
    secrets.delete("never-saved")  # nothing to delete: no error


def test_no_keyring_keeps_the_key_for_the_session_only_and_says_so():
    secrets = SecretStore(fail.Keyring())  # what keyring picks on a headless box with no Secret Service
    assert not secrets.persistent
    assert secrets.problem is not None and "session only" in secrets.problem and "\n" not in secrets.problem
    secrets.set("workstation", KEY)
    assert secrets.get("workstation") == KEY
    assert SecretStore(fail.Keyring()).get("workstation") is None  # the next session does not have it


def test_a_keyring_that_refuses_falls_back_to_the_session_with_the_reason():
    secrets = SecretStore(LockedKeyring())
    assert secrets.persistent
    secrets.set("workstation", KEY)
    assert secrets.get("workstation") == KEY and not secrets.persistent
    assert secrets.problem is not None and "the collection is locked" in secrets.problem


# -- store schema 4 ---------------------------------------------------------------------------
SCHEMA_V3 = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, system_prompt TEXT NOT NULL DEFAULT '', sampling TEXT NOT NULL DEFAULT '{}',
    mode TEXT);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL, role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL, complete INTEGER NOT NULL DEFAULT 1, created_at REAL NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}', version INTEGER NOT NULL DEFAULT 1);
CREATE INDEX messages_by_conversation ON messages(conversation_id, position);
CREATE TABLE message_versions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    version INTEGER NOT NULL, content TEXT NOT NULL, complete INTEGER NOT NULL, stats TEXT NOT NULL,
    created_at REAL NOT NULL, UNIQUE (message_id, version));
INSERT INTO conversations (title, created_at, updated_at, mode) VALUES ('old chat', 1, 1, 'chat');
INSERT INTO messages (conversation_id, position, role, content, created_at) VALUES (1, 0, 'user', 'Hi', 1);
INSERT INTO messages (conversation_id, position, role, content, created_at, version) VALUES
    (1, 1, 'assistant', 'second', 2, 2);
INSERT INTO message_versions (message_id, version, content, complete, stats, created_at) VALUES
    (2, 1, 'first', 1, '{}', 1);
PRAGMA user_version=3;
"""


def test_a_schema_3_file_gains_the_engine_of_each_answer(home):
    path = db_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = sqlite3.connect(path)
    old.executescript(SCHEMA_V3)
    old.close()
    s = Store(home=home)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    user, answer = s.messages(1)
    assert (user.content, answer.content, answer.version, answer.versions) == ("Hi", "second", 2, 2)
    assert answer.engine is None  # written before engines were recorded: not known, not guessed
    s.update_message(answer.id, "second", engine="remote:gpu-box:8000/gemma-3-27b")
    assert s.show_version(answer.id, 1)  # the version shown brings its own engine (none)
    assert s.messages(1)[1].engine is None
    assert s.show_version(answer.id, 2) and s.messages(1)[1].engine == "remote:gpu-box:8000/gemma-3-27b"
    new = s.add_version(answer.id)  # Regenerate: the new version has no engine until it is written
    assert new.version == 3 and s.messages(1)[1].engine is None
    s.update_message(answer.id, "third", complete=True, engine="local:gemma-3-270m")
    s.close()
    again = Store(home=home)
    assert again.messages(1)[1].engine == "local:gemma-3-270m"
    exported = json.loads(again.export("json"))["conversations"][0]["messages"]
    assert exported == [
        {"role": "user", "content": "Hi", "complete": True},
        {"role": "assistant", "content": "third", "complete": True, "engine": "local:gemma-3-270m"},
    ]
    again.close()
