"""Conversation history in SQLite (no Qt here).

One file, `history.sqlite3`, in the data folder. WAL journal, so a reader never blocks the
writer and a crash mid-write leaves the last committed state intact. Every write is its own
transaction. The schema version lives in `PRAGMA user_version`.

`Store` is synchronous; the GUI uses `StoreThread`, which has the same methods and runs each
on one background thread (in order) so the GUI thread never waits on the disk for a streaming
answer's saves.

Pictures (schema 5) are kept **in the database**, in `message_images` (the file's own bytes and
a PNG thumbnail, keyed by message), not as files beside it: a message and its pictures are
written in one transaction, so a crash never leaves a message without its pictures or files no
row points to; deleting a conversation, a message or the messages after an edit removes them by
`ON DELETE CASCADE` with nothing to sweep on disk; and the history stays one file to back up
or move. The cost is a larger file (a picture is at most 64 MiB, the engine's limit; a
message's text and thumbnails are read without the pictures' bytes, which only a prompt or an
export reads).
"""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from phoenix_chat.app.markdown_fences import self_contained
from phoenix_chat.app.paths import data_dir
from phoenix_chat.app.pictures import Picture

# 2: earlier versions of a regenerated answer (message_versions, messages.version);
# 3: conversations.mode (chat or completion, per chat);
# 4: messages.engine / message_versions.engine (which engine and model wrote an answer);
# 5: message_images (a message's pictures)
SCHEMA_VERSION = 5
# the export format's own version (it shows each answer's shown version only);
# 2: a message's pictures ("images", the bytes in base64)
EXPORT_VERSION = 2
DB_NAME = "history.sqlite3"

# The versions of an answer not on show (Regenerate keeps the old one here); the shown one is
# the messages row, so history, search and export read only what the user sees.
_VERSIONS_TABLE = """
CREATE TABLE IF NOT EXISTS message_versions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id  INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    version     INTEGER NOT NULL,
    content     TEXT NOT NULL,
    complete    INTEGER NOT NULL,
    stats       TEXT NOT NULL,
    created_at  REAL NOT NULL,
    UNIQUE (message_id, version)
);
"""
_VERSIONS_ENGINE = "ALTER TABLE message_versions ADD COLUMN engine TEXT;"  # schema 4: who wrote that version
# A message's pictures in the order attached (schema 5); see the module doc for why in here.
_IMAGES_TABLE = """
CREATE TABLE IF NOT EXISTS message_images (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id  INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    name        TEXT NOT NULL,
    format      TEXT NOT NULL,  -- PNG | JPEG | WEBP | GIF
    width       INTEGER NOT NULL,
    height      INTEGER NOT NULL,
    sha256      TEXT NOT NULL,  -- of data
    data        BLOB NOT NULL,  -- the file's bytes as attached
    thumbnail   BLOB NOT NULL,  -- PNG
    UNIQUE (message_id, position)
);
"""
# version → the script that brings a database of the version before up to it
_MIGRATIONS = {
    2: "ALTER TABLE messages ADD COLUMN version INTEGER NOT NULL DEFAULT 1;" + _VERSIONS_TABLE,
    3: "ALTER TABLE conversations ADD COLUMN mode TEXT;",
    4: "ALTER TABLE messages ADD COLUMN engine TEXT;" + _VERSIONS_ENGINE,
    5: _IMAGES_TABLE,
}
_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS conversations (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    title         TEXT NOT NULL,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    sampling      TEXT NOT NULL DEFAULT '{}',
    mode          TEXT  -- "chat" | "completion"; NULL: the model's default (completion for a base model)
);
CREATE TABLE IF NOT EXISTS messages (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: late writes cannot hit a newer message
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position        INTEGER NOT NULL,
    role            TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content         TEXT NOT NULL,
    complete        INTEGER NOT NULL DEFAULT 1,
    created_at      REAL NOT NULL,
    stats           TEXT NOT NULL DEFAULT '{}',
    version         INTEGER NOT NULL DEFAULT 1,  -- which version of this answer is shown (1-based)
    engine          TEXT  -- who wrote an answer: "local:<model name>" or "remote:<host>/<model>"; NULL: not known
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, position);
"""
    + _VERSIONS_TABLE
    + _VERSIONS_ENGINE
    + _IMAGES_TABLE
)


@dataclass
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float
    system_prompt: str = ""
    sampling: dict = field(default_factory=dict)
    mode: str | None = None  # "chat" | "completion"; None: the model's default


@dataclass(frozen=True)
class ImageRef:
    """A saved picture as the chat view needs it: everything but the picture's bytes."""

    id: int
    name: str
    format: str
    width: int
    height: int
    sha256: str
    thumbnail: bytes  # PNG


@dataclass
class Message:
    id: int
    conversation_id: int
    position: int
    role: str
    content: str
    complete: bool = True
    stats: dict = field(default_factory=dict)
    version: int = 1  # the version of this answer on show (Regenerate adds one)
    versions: int = 1  # how many versions it has
    engine: str | None = None  # who wrote this answer ("local:gemma-3-270m", "remote:host:8000/model")
    images: list[ImageRef] = field(default_factory=list)  # a user message's pictures, in order


def db_path(home=None) -> Path:
    return data_dir(home) / DB_NAME


class Store:
    """All reads and writes of the history database."""

    def __init__(self, path: str | Path | None = None, *, home=None):
        self.path = Path(path) if path is not None else db_path(home)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        # autocommit mode; transactions are explicit (`with self._tx()`).
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a power cut may lose the last commits but never corrupts the file.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._migrate()

    # -- plumbing -------------------------------------------------------------------------
    def _migrate(self) -> None:
        with self._lock:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"{self.path} was written by a newer Phoenix Chat (schema {version})")
            if version == 0:  # a new file: today's schema at once
                self._db.executescript("BEGIN;" + _SCHEMA + f"PRAGMA user_version={SCHEMA_VERSION};COMMIT;")
                return
            for step in range(version + 1, SCHEMA_VERSION + 1):  # each in its own transaction
                self._db.executescript("BEGIN;" + _MIGRATIONS[step] + f"PRAGMA user_version={step};COMMIT;")

    def _tx(self):
        return _Transaction(self._db, self._lock)

    def journal_mode(self) -> str:
        return self._db.execute("PRAGMA journal_mode").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- conversations --------------------------------------------------------------------
    def create_conversation(
        self, title: str = "New chat", system_prompt: str = "", sampling: dict | None = None
    ) -> Conversation:
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt, sampling) "
                "VALUES (?, ?, ?, ?, ?)",
                (title, now, now, system_prompt, json.dumps(sampling or {})),
            )
            return Conversation(cur.lastrowid, title, now, now, system_prompt, dict(sampling or {}))

    def conversation(self, conversation_id: int) -> Conversation | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return _conversation(row) if row else None

    def list_conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches the title or any message text (case-insensitive)."""
        with self._lock:
            if search:
                pattern = f"%{_escape_like(search)}%"
                rows = self._db.execute(
                    "SELECT * FROM conversations c WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS ("
                    " SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\')"
                    " ORDER BY updated_at DESC, id DESC",
                    (pattern, pattern),
                ).fetchall()
            else:
                rows = self._db.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC").fetchall()
        return [_conversation(r) for r in rows]

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE conversations SET title = ?, updated_at = ? WHERE id = ?", (title, time.time(), conversation_id)
            )

    def update_conversation_settings(
        self, conversation_id: int, *, system_prompt: str | None = None, sampling: dict | None = None
    ) -> None:
        with self._tx() as db:
            if system_prompt is not None:
                db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (system_prompt, conversation_id))
            if sampling is not None:
                db.execute(
                    "UPDATE conversations SET sampling = ? WHERE id = ?", (json.dumps(sampling), conversation_id)
                )

    def set_conversation_mode(self, conversation_id: int, mode: str | None) -> None:
        """Chat or completion mode for this conversation (None: the model's default)."""
        if mode not in (None, "chat", "completion"):
            raise ValueError(f"mode must be 'chat', 'completion' or None, not {mode!r}")
        with self._tx() as db:
            db.execute("UPDATE conversations SET mode = ? WHERE id = ?", (mode, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages -------------------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[Message]:
        with self._lock:
            rows = self._db.execute(
                "SELECT m.*, 1 + (SELECT COUNT(*) FROM message_versions v WHERE v.message_id = m.id) AS versions"
                " FROM messages m WHERE conversation_id = ? ORDER BY position",
                (conversation_id,),
            ).fetchall()
            pictures = self._db.execute(
                "SELECT i.id, i.message_id, i.name, i.format, i.width, i.height, i.sha256, i.thumbnail"
                " FROM message_images i JOIN messages m ON m.id = i.message_id"
                " WHERE m.conversation_id = ? ORDER BY i.message_id, i.position",
                (conversation_id,),
            ).fetchall()
        by_message: dict[int, list[ImageRef]] = {}
        for p in pictures:
            by_message.setdefault(p["message_id"], []).append(
                ImageRef(p["id"], p["name"], p["format"], p["width"], p["height"], p["sha256"], p["thumbnail"])
            )
        return [_message(r, by_message.get(r["id"], [])) for r in rows]

    def message_pictures(self, message_id: int) -> list[Picture]:
        """A message's pictures with their bytes, in the order attached (for a prompt, an export)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM message_images WHERE message_id = ? ORDER BY position", (message_id,)
            ).fetchall()
        return [Picture(r["name"], r["format"], r["data"], r["width"], r["height"], r["thumbnail"]) for r in rows]

    def picture(self, image_id: int) -> Picture | None:
        """One saved picture with its bytes (the chat view shows it full size)."""
        with self._lock:
            r = self._db.execute("SELECT * FROM message_images WHERE id = ?", (image_id,)).fetchone()
        return Picture(r["name"], r["format"], r["data"], r["width"], r["height"], r["thumbnail"]) if r else None

    def add_pictures(self, message_id: int, pictures: Sequence[Picture]) -> None:
        """Attach `pictures` to a message, after the ones it has."""
        with self._tx() as db:
            self._insert_pictures(db, message_id, pictures)

    @staticmethod
    def _insert_pictures(db: sqlite3.Connection, message_id: int, pictures: Sequence[Picture]) -> None:
        start = db.execute(
            "SELECT COALESCE(MAX(position), -1) + 1 FROM message_images WHERE message_id = ?", (message_id,)
        ).fetchone()[0]
        db.executemany(
            "INSERT INTO message_images (message_id, position, name, format, width, height, sha256, data, thumbnail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (message_id, start + i, p.name, p.format, p.width, p.height, p.sha256, p.data, p.thumbnail)
                for i, p in enumerate(pictures)
            ],
        )

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        complete: bool = True,
        stats: dict | None = None,
        pictures: Sequence[Picture] = (),
    ) -> Message:
        """A new last message of the conversation; `pictures` are saved with it, in the same transaction."""
        now = time.time()
        with self._tx() as db:
            pos = db.execute(
                "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()[0]
            cur = db.execute(
                "INSERT INTO messages (conversation_id, position, role, content, complete, created_at, stats) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, pos, role, content, int(complete), now, json.dumps(stats or {})),
            )
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
            message_id = cur.lastrowid
            assert message_id is not None  # an INSERT's rowid
            self._insert_pictures(db, message_id, pictures)
            refs = [
                ImageRef(r["id"], r["name"], r["format"], r["width"], r["height"], r["sha256"], r["thumbnail"])
                for r in db.execute(
                    "SELECT id, name, format, width, height, sha256, thumbnail FROM message_images"
                    " WHERE message_id = ? ORDER BY position",
                    (message_id,),
                )
            ]
        message = Message(message_id, conversation_id, pos, role, content, complete, dict(stats or {}))
        message.images = refs
        return message

    def update_message(
        self,
        message_id: int,
        content: str,
        *,
        complete: bool | None = None,
        stats: dict | None = None,
        engine: str | None = None,
    ) -> None:
        """Replace a message's text (a streaming answer is saved this way, repeatedly); `engine`:
        which engine and model wrote it (kept when None)."""
        with self._tx() as db:
            db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))
            if complete is not None:
                db.execute("UPDATE messages SET complete = ? WHERE id = ?", (int(complete), message_id))
            if stats is not None:
                db.execute("UPDATE messages SET stats = ? WHERE id = ?", (json.dumps(stats), message_id))
            if engine is not None:
                db.execute("UPDATE messages SET engine = ? WHERE id = ?", (engine, message_id))

    def add_version(self, message_id: int) -> Message:
        """Regenerate: keep the answer's shown text as an earlier version and empty the row
        (complete=0) for the new version, which becomes the shown one and is numbered last."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None or row["role"] != "assistant":
                raise ValueError(f"message {message_id} is not an answer")
            db.execute(
                "INSERT INTO message_versions (message_id, version, content, complete, stats, created_at, engine) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    message_id,
                    row["version"],
                    row["content"],
                    row["complete"],
                    row["stats"],
                    row["created_at"],
                    row["engine"],
                ),
            )
            count = db.execute("SELECT COUNT(*) FROM message_versions WHERE message_id = ?", (message_id,)).fetchone()
            number = count[0] + 1
            db.execute(
                "UPDATE messages SET content = '', complete = 0, stats = '{}', version = ?, created_at = ?, "
                "engine = NULL WHERE id = ?",
                (number, time.time(), message_id),
            )
        return Message(message_id, row["conversation_id"], row["position"], "assistant", "", False, {}, number, number)

    def show_version(self, message_id: int, version: int) -> bool:
        """Put version `version` of an answer on show (the one shown goes back among the
        others); False when there is no such version."""
        with self._tx() as db:
            other = db.execute(
                "SELECT * FROM message_versions WHERE message_id = ? AND version = ?", (message_id, version)
            ).fetchone()
            shown = db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
            if other is None or shown is None:
                return False
            db.execute(
                "UPDATE message_versions SET version = ?, content = ?, complete = ?, stats = ?, created_at = ?, "
                "engine = ? WHERE id = ?",
                (
                    shown["version"],
                    shown["content"],
                    shown["complete"],
                    shown["stats"],
                    shown["created_at"],
                    shown["engine"],
                    other["id"],
                ),
            )
            db.execute(
                "UPDATE messages SET version = ?, content = ?, complete = ?, stats = ?, created_at = ?, engine = ? "
                "WHERE id = ?",
                (
                    version,
                    other["content"],
                    other["complete"],
                    other["stats"],
                    other["created_at"],
                    other["engine"],
                    message_id,
                ),
            )
        return True

    def close_unfinished_answers(self, note: str) -> list[int]:
        """Mark every answer still saved as unfinished (complete=0: the app was killed or quit
        while it streamed) as finished with finish_reason "interrupted" and `note`. Run once at
        start, before any answer begins; returns their ids."""
        with self._tx() as db:
            rows = db.execute("SELECT id, stats FROM messages WHERE complete = 0 AND role = 'assistant'").fetchall()
            for row in rows:
                stats = {**json.loads(row["stats"] or "{}"), "finish_reason": "interrupted", "note": note}
                db.execute("UPDATE messages SET complete = 1, stats = ? WHERE id = ?", (json.dumps(stats), row["id"]))
        return [row["id"] for row in rows]

    def truncate_after(self, message_id: int, *, inclusive: bool = False) -> None:
        """Delete the messages after `message_id` in its conversation (and itself if inclusive)."""
        with self._tx() as db:
            row = db.execute("SELECT conversation_id, position FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return
            op = ">=" if inclusive else ">"
            db.execute(
                f"DELETE FROM messages WHERE conversation_id = ? AND position {op} ?",
                (row["conversation_id"], row["position"]),
            )

    def edit_message(self, message_id: int, content: str) -> None:
        """Change an earlier message and forget everything after it (edit-and-resend); its
        pictures stay with it."""
        with self._tx() as db:
            db.execute("UPDATE messages SET content = ?, complete = 1 WHERE id = ?", (content, message_id))
        self.truncate_after(message_id)

    # -- export ---------------------------------------------------------------------------
    def export(self, fmt: str, conversation_ids: list[int] | None = None) -> str:
        convs = self.list_conversations()
        convs.sort(key=lambda c: (c.created_at, c.id))
        if conversation_ids is not None:
            wanted = set(conversation_ids)
            convs = [c for c in convs if c.id in wanted]
        items = [(c, self.messages(c.id)) for c in convs]
        if fmt == "json":
            return (
                json.dumps(
                    {
                        "format": "phoenix-chat",
                        "version": EXPORT_VERSION,
                        "conversations": [
                            {
                                "id": c.id,
                                "title": c.title,
                                "created_at": c.created_at,
                                "system_prompt": c.system_prompt,
                                "sampling": c.sampling,
                                "messages": [_exported(m, self.message_pictures(m.id)) for m in msgs],
                            }
                            for c, msgs in items
                        ],
                    },
                    ensure_ascii=False,
                    indent=2,
                )
                + "\n"
            )
        if fmt in ("markdown", "md"):
            out = []
            for c, msgs in items:
                out.append(f"# {c.title}\n")
                if c.system_prompt:
                    out.append(f"**System:** {self_contained(c.system_prompt)}\n")
                for m in msgs:
                    # Self-contained: a fence a message leaves open must not swallow the rest.
                    out.append(f"## {m.role.capitalize()}\n\n{self_contained(m.content)}\n")
                    # pictures embedded as data: URLs, so the one file holds them
                    out.extend(
                        f"![{_md_alt(p.name)}](data:{p.media_type};base64,{base64.b64encode(p.data).decode()})\n"
                        for p in (self.message_pictures(m.id) if m.images else [])
                    )
            return "\n".join(out)
        raise ValueError(f"unknown export format {fmt!r} (json or markdown)")


def export_all(fmt: str, home=None) -> str:
    """Every conversation as `fmt` ("json" or "markdown"): role and content of each message."""
    path = db_path(home)
    store = Store(path)
    try:
        return store.export(fmt)
    finally:
        store.close()


P = ParamSpec("P")
R = TypeVar("R")


def _queued(
    method: Callable[Concatenate[Store, P], R],
) -> Callable[Concatenate[StoreThread, P], concurrent.futures.Future[R]]:
    """`method` queued on the store thread; the caller gets a Future and does not wait."""

    @functools.wraps(method)
    def queue(self: StoreThread, *args: P.args, **kwargs: P.kwargs) -> concurrent.futures.Future[R]:
        return self._pool.submit(method, self.store, *args, **kwargs)

    return queue


def _waited(method: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[StoreThread, P], R]:
    """`method` run on the store thread; the caller waits for its result."""
    queue = _queued(method)

    @functools.wraps(method)
    def wait(self: StoreThread, *args: P.args, **kwargs: P.kwargs) -> R:
        return queue(self, *args, **kwargs).result()

    return wait


class StoreThread:
    """`Store`'s methods, by the same names and signatures, run on one background thread in
    submission order.

    Reads, and the writes the GUI acts on at once, wait for their result (reads are quick
    and must see prior writes); `update_message`, saved repeatedly while an answer streams,
    returns a concurrent Future instead (wrap it with `asyncio.wrap_future` to await).
    """

    def __init__(self, store: Store):
        self.store = store
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")

    conversation = _waited(Store.conversation)
    list_conversations = _waited(Store.list_conversations)
    create_conversation = _waited(Store.create_conversation)
    rename_conversation = _waited(Store.rename_conversation)
    update_conversation_settings = _waited(Store.update_conversation_settings)
    set_conversation_mode = _waited(Store.set_conversation_mode)
    delete_conversation = _waited(Store.delete_conversation)
    messages = _waited(Store.messages)
    message_pictures = _waited(Store.message_pictures)
    picture = _waited(Store.picture)
    add_pictures = _waited(Store.add_pictures)
    add_message = _waited(Store.add_message)
    edit_message = _waited(Store.edit_message)
    truncate_after = _waited(Store.truncate_after)
    add_version = _waited(Store.add_version)
    show_version = _waited(Store.show_version)
    close_unfinished_answers = _waited(Store.close_unfinished_answers)
    export = _waited(Store.export)
    update_message = _queued(Store.update_message)

    def flush(self) -> None:
        self._pool.submit(lambda: None).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.store.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection, lock: threading.RLock):
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb):
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.lock.release()


def _exported(m: Message, pictures: list[Picture]) -> dict:
    """A message in the JSON export; an answer says which engine wrote it where that is known,
    a message with pictures holds them (the file's bytes in base64)."""
    out: dict = {"role": m.role, "content": m.content, "complete": m.complete}
    if m.engine is not None:
        out["engine"] = m.engine
    if pictures:
        out["images"] = [
            {
                "name": p.name,
                "media_type": p.media_type,
                "width": p.width,
                "height": p.height,
                "sha256": p.sha256,
                "data": base64.b64encode(p.data).decode(),
            }
            for p in pictures
        ]
    return out


def _md_alt(name: str) -> str:
    """A file name as Markdown image alt text (no brackets or newlines to break the link)."""
    return " ".join(name.replace("[", "(").replace("]", ")").split())


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _conversation(row) -> Conversation:
    return Conversation(
        row["id"],
        row["title"],
        row["created_at"],
        row["updated_at"],
        row["system_prompt"],
        json.loads(row["sampling"] or "{}"),
        row["mode"],
    )


def _message(row, images: list[ImageRef] | None = None) -> Message:
    return Message(
        row["id"],
        row["conversation_id"],
        row["position"],
        row["role"],
        row["content"],
        bool(row["complete"]),
        json.loads(row["stats"] or "{}"),
        row["version"],
        row["versions"] if "versions" in row.keys() else 1,
        row["engine"],
        images or [],
    )
