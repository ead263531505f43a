"""A message's pictures in the SQLite history (schema 5): saved with the message in one
transaction, read back with thumbnails, kept by an edit, removed with their message or
conversation, migrated into from a schema-4 file, and carried by both exports; and the checks
made when a picture is attached (the engine's decoder: not an image, truncated, a bomb)."""

from __future__ import annotations

import base64
import io
import json
import sqlite3
from pathlib import Path

import pytest
from PIL import Image

from phoenix_chat.app.pictures import THUMBNAIL_PX, picture_from_bytes, read_picture
from phoenix_chat.app.store import Store, db_path
from phoenix_chat.engine.vision.images import ImageError
from tests.test_vision_inputs import png_header

IMAGES = Path(__file__).resolve().parents[1] / "goldens" / "vision_images"


def image_rows(home) -> int:
    return sqlite3.connect(db_path(home)).execute("SELECT COUNT(*) FROM message_images").fetchone()[0]


def test_pictures_are_saved_with_their_message_and_read_back(home):
    portrait, exif = read_picture(IMAGES / "portrait_rgba.png"), read_picture(IMAGES / "exif_rotated.jpg")
    assert portrait.data == (IMAGES / "portrait_rgba.png").read_bytes()
    assert (portrait.format, exif.format, exif.media_type) == ("PNG", "JPEG", "image/jpeg")
    # the thumbnail is the upright picture (EXIF applied), at most THUMBNAIL_PX a side
    with Image.open(IMAGES / "exif_rotated.jpg") as raw:
        stored_size = raw.size
    upright = (exif.width, exif.height)
    assert upright == stored_size[::-1]  # the test picture's orientation tag turns it
    thumb = Image.open(io.BytesIO(exif.thumbnail))
    assert thumb.format == "PNG" and max(thumb.size) <= THUMBNAIL_PX
    assert (thumb.width > thumb.height) == (exif.width > exif.height)

    s = Store(home=home)
    c = s.create_conversation("Pictures")
    m = s.add_message(c.id, "user", "what is this?", pictures=[portrait, exif])
    assert [i.name for i in m.images] == ["portrait_rgba.png", "exif_rotated.jpg"]
    s.add_message(c.id, "assistant", "a picture")
    s.close()
    again = Store(home=home)  # a restart reads them back
    user, answer = again.messages(c.id)
    assert [(i.name, i.sha256, i.thumbnail) for i in user.images] == [
        ("portrait_rgba.png", portrait.sha256, portrait.thumbnail),
        ("exif_rotated.jpg", exif.sha256, exif.thumbnail),
    ]
    assert answer.images == []
    assert [p.data for p in again.message_pictures(user.id)] == [portrait.data, exif.data]
    again.close()


def test_an_edit_keeps_the_pictures_and_deletes_remove_them(home):
    picture = read_picture(IMAGES / "small.webp")
    s = Store(home=home)
    c = s.create_conversation("Edit")
    first = s.add_message(c.id, "user", "one", pictures=[picture])
    s.add_message(c.id, "assistant", "ok")
    s.add_message(c.id, "user", "two", pictures=[picture, picture])
    assert image_rows(home) == 3
    s.edit_message(first.id, "one, edited")  # forgets the later messages and their pictures
    (edited,) = s.messages(c.id)
    assert edited.content == "one, edited" and [i.name for i in edited.images] == ["small.webp"]
    assert image_rows(home) == 1
    s.add_pictures(first.id, [read_picture(IMAGES / "gray.png")])  # sent with pending ones: added after
    assert [i.name for i in s.messages(c.id)[0].images] == ["small.webp", "gray.png"]
    s.truncate_after(first.id, inclusive=True)
    assert image_rows(home) == 0
    other = s.create_conversation("Other")
    s.add_message(other.id, "user", "", pictures=[picture])
    assert image_rows(home) == 1
    s.delete_conversation(other.id)
    assert image_rows(home) == 0
    s.close()


def test_a_schema_4_history_gains_the_pictures_table(home):
    s = Store(home=home)
    c = s.create_conversation("Before pictures")
    s.add_message(c.id, "user", "old message")
    s.close()
    db = sqlite3.connect(db_path(home))
    db.executescript("DROP TABLE message_images; PRAGMA user_version=4;")
    db.close()
    s = Store(home=home)
    (old,) = s.messages(c.id)
    assert old.content == "old message" and old.images == []
    s.add_message(c.id, "user", "new", pictures=[read_picture(IMAGES / "gray.png")])
    assert sqlite3.connect(db_path(home)).execute("PRAGMA user_version").fetchone()[0] == 5
    assert image_rows(home) == 1
    s.close()


def test_exports_carry_the_pictures(home):
    portrait, gif = read_picture(IMAGES / "portrait_rgba.png"), read_picture(IMAGES / "two_frames.gif")
    s = Store(home=home)
    c = s.create_conversation("Export")
    s.add_message(c.id, "user", "look", pictures=[portrait, gif])
    s.add_message(c.id, "assistant", "seen")
    data = json.loads(s.export("json"))
    assert data["version"] == 2
    user, answer = data["conversations"][0]["messages"]
    assert "images" not in answer
    assert [(i["name"], i["media_type"], i["sha256"]) for i in user["images"]] == [
        ("portrait_rgba.png", "image/png", portrait.sha256),
        ("two_frames.gif", "image/gif", gif.sha256),
    ]
    assert base64.b64decode(user["images"][0]["data"]) == portrait.data
    md = s.export("markdown")
    url = f"![portrait_rgba.png](data:image/png;base64,{base64.b64encode(portrait.data).decode()})"
    assert "## User\n\nlook\n" in md and url in md and "data:image/gif;base64," in md
    assert md.index(url) < md.index("## Assistant")
    s.close()


def test_bad_files_are_refused_when_attached_with_the_engines_reason(tmp_path):
    text = tmp_path / "notes.png"
    text.write_text("not a picture at all")
    with pytest.raises(ImageError, match="not an image Phoenix Chat reads"):
        read_picture(text)
    whole = (IMAGES / "portrait_rgba.png").read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ImageError, match="damaged or truncated|unreadable"):
        read_picture(cut)
    with pytest.raises(ImageError, match="decompression bomb"):
        picture_from_bytes(png_header(100_000, 100_000), "pasted image.png")
    with pytest.raises(ImageError, match="no such image file"):
        read_picture(tmp_path / "gone.png")
    huge = tmp_path / "huge.png"  # sparse: refused from its size, before a byte is read
    with huge.open("wb") as f:
        f.write(whole)
        f.truncate(65 * 2**20)
    with pytest.raises(ImageError, match="over the 64 MiB image limit"):
        read_picture(huge)
