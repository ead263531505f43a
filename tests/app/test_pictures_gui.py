"""Pictures in the window, on the real worker process (issue 22): a tiny random-weight
Gemma3ForConditionalGeneration (tools/tiny_vision_model.py) on the CPU backend, a real SQLite
history, real test pictures. Every way in (a drop, Attach image…, a paste) and out (✕ on a
pending picture, an edit, Regenerate, a restart) is checked where it lands: the pictures the
engine was given (GENERATION_STARTED's encoder keys), the answer against the engine's own
greedy answer for that prompt and picture, the rows in the store. The embedded 270M (text-only)
says so in one line; bad files are refused when attached."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from PIL import Image
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication, QImage, QTextCursor
from PySide6.QtWidgets import QApplication, QToolButton

from phoenix_chat.app.controllers import attachments_controller
from phoenix_chat.app.secrets import SecretStore
from phoenix_chat.app.server.config import ServerConfig
from phoenix_chat.app.server.running import start_server
from phoenix_chat.app.store import db_path
from phoenix_chat.engine.generate import PromptIds, encode_prompt, generate
from phoenix_chat.engine.loader import load
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler
from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded
from tests.app.test_remote_settings import MemoryKeyring
from tests.app.transcript_links import click_link
from tools.tiny_vision_model import build

pytestmark = [pytest.mark.gui, pytest.mark.slow]

IMAGES = Path(__file__).resolve().parents[1] / "goldens" / "vision_images"
ANSWER = 6
GREEDY = SamplingParams(temperature=0.0)  # the app's sampling defaults at temperature 0
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def vision_path(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("vision") / "tiny-gemma3-vision")


@pytest.fixture(scope="module")
def vision_model(vision_path):
    """The same model in this process: the engine's own answers and picture keys to compare with."""
    m = load(vision_path, backend="cpu")
    yield m
    m.close()


def engine_answer(model, messages: list[dict]) -> str:
    return generate(model, messages, GREEDY, max_tokens=ANSWER)


def key(model, data: bytes) -> str:
    """The encoder's key for a picture (SHA-256 of its pixel values): what GENERATION_STARTED reports."""
    return model.vision.encode(data)[0]


def user_turn(pictures: list[bytes], text: str) -> dict:
    return {
        "role": "user",
        "content": [*({"type": "image", "image": p} for p in pictures), {"type": "text", "text": text}],
    }


def image_rows(home) -> list[tuple[int, bytes]]:
    db = sqlite3.connect(db_path(home))
    return db.execute("SELECT message_id, data FROM message_images ORDER BY message_id, position").fetchall()


def drop(widget, mime: QMimeData) -> bool:
    """Drag `mime` onto `widget` and drop it there; True when the widget accepted both."""
    point = QPointF(widget.rect().center())
    args = (Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    enter = QDragEnterEvent(point, *args)
    QApplication.sendEvent(widget, enter)
    dropped = QDropEvent(point, *args)
    QApplication.sendEvent(widget, dropped)
    return enter.isAccepted() and dropped.isAccepted()


def drop_files(view, *paths: Path) -> bool:
    """Drop local files on the chat pane, as a file manager does; True when the pane accepted
    them. The pictures are then being checked (`checked` waits for that)."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return drop(view, mime)


def click_picture(qtbot, view, nth: int = 0) -> str:
    """Click the nth picture in the transcript with the mouse; returns the link under it."""
    doc = view.transcript.document()
    positions = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().isImageFormat():
                positions += range(fragment.position(), fragment.position() + fragment.length())
            it += 1
        block = block.next()
    cursor = QTextCursor(doc)
    cursor.setPosition(positions[nth])
    view.transcript.setTextCursor(cursor)
    view.transcript.ensureCursorVisible()
    left = view.transcript.cursorRect(cursor)
    cursor.movePosition(QTextCursor.MoveOperation.NextCharacter)
    right = view.transcript.cursorRect(cursor)
    point = QPoint((left.x() + right.x()) // 2, left.center().y())
    href = view.transcript.anchorAt(point)
    qtbot.mouseClick(view.transcript.viewport(), Qt.MouseButton.LeftButton, pos=point)
    return href


def checked(qtbot, app) -> list[str]:
    """Wait until the offered pictures are checked; the names of those attached."""
    qtbot.waitUntil(lambda: not app.chat.attachments.checking, timeout=10_000)
    return app.window.chat.attachment_names()


class Answers:
    """What the worker reports for each answer: what the engine was given, and the text."""

    def __init__(self, app):
        self.started: list[dict] = []
        self.deltas: list[str] = []
        app.worker.generation_started.connect(lambda _id, info: self.started.append(info))
        app.worker.tokens_changed.connect(lambda _id, text: self.deltas.append(text))

    def text(self) -> str:
        return "".join(self.deltas)


def finish(qtbot, app, action):
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        action()
    return blocker.args  # (answer id, finish reason)


def test_a_dropped_picture_is_answered_saved_and_survives_a_restart(qtbot, make_app, home, vision_path, vision_model):
    preset(home, backend="cpu", max_tokens=ANSWER, temperature=0.0)
    app = make_app(model_path=str(vision_path))
    view = app.window.chat
    assert wait_loaded(qtbot, app)["image_input"] is True
    assert not view.completion_switch.isChecked()  # an instruction-tuned model: chat mode
    picture = IMAGES / "portrait_rgba.png"
    assert drop_files(view, picture)
    # checked on a thread: meanwhile the strip says so and Send waits
    assert view.attachments_checking.isVisible() and not view.send_button.isEnabled()
    assert checked(qtbot, app) == ["portrait_rgba.png"] and view.attachments.isVisible()
    assert view.notice_kind() is None  # this model reads pictures: nothing to warn about
    assert view.send_button.isEnabled() and not view.attachments_checking.isVisible()
    seen = Answers(app)
    qtbot.keyClicks(view.input, QUESTION)
    _, reason = finish(qtbot, app, lambda: qtbot.keyClick(view.input, Qt.Key.Key_Return))
    expected = engine_answer(vision_model, [user_turn([picture.read_bytes()], QUESTION)])
    assert reason == "length" and expected.strip()
    assert seen.text() == expected  # streamed, and the engine's own greedy answer for that picture
    assert seen.started[0]["images"] == [key(vision_model, picture.read_bytes())]
    assert view.attachment_names() == [] and not view.attachments.isVisible()  # sent with the message
    # on show: the picture's thumbnail in the user's message, the answer after it
    user, answer = app.chat.messages
    assert view.message_pictures() == [[user.images[0].sha256], []]
    assert expected.strip().splitlines()[0] in view.transcript_text()
    app.store.flush()
    assert image_rows(home) == [(user.id, picture.read_bytes())]
    conversation = app.chat.conversation_id
    app.shutdown()

    again = make_app(model_path=str(vision_path))  # a restart on the same history
    view = again.window.chat
    assert again.chat.conversation_id == conversation
    user, answer = again.chat.messages
    assert (user.content, [i.name for i in user.images], answer.content) == (QUESTION, ["portrait_rgba.png"], expected)
    assert view.message_pictures() == [[user.images[0].sha256], []]
    # a click on the thumbnail shows the picture full size
    assert click_picture(qtbot, view).endswith(f"/picture/{user.images[0].id}")
    shown = again.chat.picture_window
    assert shown is not None and shown.isVisible() and shown.windowTitle().startswith("portrait_rgba.png")
    assert (shown.size_shown.width(), shown.size_shown.height()) == (user.images[0].width, user.images[0].height)
    wait_loaded(qtbot, again)
    seen = Answers(again)
    # Regenerate reads the picture again from the store: the same greedy answer
    finish(qtbot, again, lambda: qtbot.mouseClick(view.regenerate_button, Qt.MouseButton.LeftButton))
    assert seen.text() == expected and seen.started[0]["images"] == [key(vision_model, picture.read_bytes())]
    assert again.chat.messages[1].versions == 2
    # an edit keeps the message's pictures
    assert click_link(qtbot, view, "Edit", 0).endswith(f"/edit/{user.id}")
    view.input.setPlainText("Describe it briefly.")
    finish(qtbot, again, lambda: qtbot.keyClick(view.input, Qt.Key.Key_Return))
    expected_edit = engine_answer(vision_model, [user_turn([picture.read_bytes()], "Describe it briefly.")])
    assert seen.started[1]["images"] == [key(vision_model, picture.read_bytes())]
    assert seen.text() == expected + expected_edit
    again.store.flush()
    assert image_rows(home) == [(user.id, picture.read_bytes())]

    # the exports carry it
    again.chat.export_current("json", home / "chat.json")
    exported = json.loads((home / "chat.json").read_text())["conversations"][0]["messages"][0]
    assert [(i["name"], i["media_type"]) for i in exported["images"]] == [("portrait_rgba.png", "image/png")]
    again.chat.export_current("markdown", home / "chat.md")
    assert "![portrait_rgba.png](data:image/png;base64," in (home / "chat.md").read_text()
    # deleting the conversation removes its pictures
    again.chat.delete_conversation(conversation)
    again.store.flush()
    assert image_rows(home) == []
    assert view.transcript.thumbnails == {}  # the view keeps no thumbnails of chats not on show


def test_attach_button_paste_and_remove_reach_the_engine(qtbot, make_app, home, vision_path, vision_model, monkeypatch):
    preset(home, backend="cpu", max_tokens=ANSWER, temperature=0.0)
    app = make_app(model_path=str(vision_path))
    view = app.window.chat
    wait_loaded(qtbot, app)
    chosen = [str(IMAGES / "exif_rotated.jpg"), str(IMAGES / "small.webp")]
    monkeypatch.setattr(
        attachments_controller.QFileDialog, "getOpenFileNames", lambda *args, **kwargs: (chosen, "Images")
    )
    qtbot.mouseClick(view.attach_button, Qt.MouseButton.LeftButton)
    assert checked(qtbot, app) == ["exif_rotated.jpg", "small.webp"]
    # paste a copied picture (image data, not a file) into the message box
    QGuiApplication.clipboard().setImage(QImage(str(IMAGES / "gray.png")))
    view.input.setFocus()
    qtbot.keyClick(view.input, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert checked(qtbot, app) == ["exif_rotated.jpg", "small.webp", "pasted image.png"]
    assert view.input.toPlainText() == ""  # the picture went to the attachments, not into the text
    # ✕ on the WebP: it does not go
    removes = view.attachments.findChildren(QToolButton, "removeAttachment")
    assert [r.toolTip() for r in removes] == ["Remove exif_rotated.jpg", "Remove small.webp", "Remove pasted image.png"]
    qtbot.mouseClick(removes[1], Qt.MouseButton.LeftButton)
    assert view.attachment_names() == ["exif_rotated.jpg", "pasted image.png"]
    # paste a copied file (a file manager's copy: its URL)
    copied = QMimeData()
    copied.setUrls([QUrl.fromLocalFile(str(IMAGES / "portrait_rgba.png"))])
    QGuiApplication.clipboard().setMimeData(copied)
    qtbot.keyClick(view.input, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert checked(qtbot, app) == ["exif_rotated.jpg", "pasted image.png", "portrait_rgba.png"]
    QGuiApplication.clipboard().clear()  # the clipboard owns `copied`: let it go now, not at exit
    seen = Answers(app)
    qtbot.keyClicks(view.input, "Compare them.")
    finish(qtbot, app, lambda: qtbot.keyClick(view.input, Qt.Key.Key_Return))
    user = app.chat.messages[0]
    saved = [p.data for p in app.store.message_pictures(user.id)]
    exif = (IMAGES / "exif_rotated.jpg").read_bytes()
    portrait = (IMAGES / "portrait_rgba.png").read_bytes()
    assert saved[0] == exif and saved[2] == portrait
    # full size, upright as the model reads it (the JPEG's EXIF orientation turns it)
    click_picture(qtbot, view, 0)
    shown = app.chat.picture_window
    assert shown is not None and shown.isVisible()
    assert (shown.size_shown.width(), shown.size_shown.height()) == (user.images[0].width, user.images[0].height)
    with Image.open(IMAGES / "exif_rotated.jpg") as stored:
        assert user.images[0].width == stored.height != stored.width
    # the pasted picture is the same pixels as the file it was copied from
    assert key(vision_model, saved[1]) == key(vision_model, (IMAGES / "gray.png").read_bytes())
    keys = [key(vision_model, data) for data in saved]
    assert seen.started[0]["images"] == keys
    first = engine_answer(vision_model, [user_turn(saved, "Compare them.")])
    assert seen.text() == first
    # Continue goes on from the answer with the pictures still in the prompt
    finish(qtbot, app, lambda: qtbot.mouseClick(view.continue_button, Qt.MouseButton.LeftButton))
    ids, spans = encode_prompt(vision_model, [user_turn(saved, "Compare them.")])
    ids += vision_model.tokenizer.encode(first, add_bos=False, parse_special=False)
    more = generate(vision_model, PromptIds(tuple(ids), tuple(spans)), GREEDY, max_tokens=ANSWER)
    assert seen.started[1]["images"] == seen.started[0]["images"]
    assert seen.text() == first + more and app.chat.messages[1].content == first + more
    # a picture alone (no text) is a message too; the earlier pictures stay in the prompt
    assert drop_files(view, IMAGES / "two_frames.gif") and checked(qtbot, app) == ["two_frames.gif"]
    finish(qtbot, app, lambda: qtbot.mouseClick(view.send_button, Qt.MouseButton.LeftButton))
    gif = (IMAGES / "two_frames.gif").read_bytes()
    assert seen.started[2]["images"] == [*keys, key(vision_model, gif)]
    assert [m.content for m in app.chat.messages][2] == ""
    # completion mode has no template to place a picture: one line says so
    qtbot.mouseClick(view.completion_switch, Qt.MouseButton.LeftButton)
    assert view.completion_switch.isChecked()
    assert drop_files(view, IMAGES / "gray.png") and checked(qtbot, app) == ["gray.png"]
    _, reason = finish(qtbot, app, lambda: app.chat.send("And now?"))
    assert reason == "error" and "pictures are read in chat mode only" in view.notice.text()


def test_pending_pictures_belong_to_their_chat(qtbot, make_app, home, vision_path, vision_model):
    """A picture attached in one chat waits there: another chat opened meanwhile shows none and
    sends none; back in the first chat it is pending again and goes with that chat's message."""
    preset(home, backend="cpu", max_tokens=ANSWER, temperature=0.0)
    app = make_app(model_path=str(vision_path))
    view = app.window.chat
    wait_loaded(qtbot, app)
    first = app.chat.conversation_id
    assert drop_files(view, IMAGES / "small.webp") and checked(qtbot, app) == ["small.webp"]
    app.chat.new_conversation()
    assert view.attachment_names() == []
    seen = Answers(app)
    finish(qtbot, app, lambda: app.chat.send("Hello"))
    assert seen.started[-1]["images"] == [] and app.store.message_pictures(app.chat.messages[0].id) == []
    app.chat.open_conversation(first)
    assert view.attachment_names() == ["small.webp"]
    finish(qtbot, app, lambda: app.chat.send("What is this?"))
    assert seen.started[-1]["images"] == [key(vision_model, (IMAGES / "small.webp").read_bytes())]
    assert view.attachment_names() == []


def test_pan_and_scan_setting_gives_the_engine_the_crops(qtbot, make_app, home, vision_path, vision_model):
    """Settings → Pan-and-scan pictures: off by default (the engine gets wide.png alone); checked,
    Regenerate gives the engine the picture and its 3 crops (GENERATION_STARTED's keys: the
    picture's, then each crop's) and the answer is the engine's own with pan-and-scan; the
    choice is saved in the settings file."""
    from phoenix_chat.app.settings import SettingsModel

    preset(home, backend="cpu", max_tokens=ANSWER, temperature=0.0)
    app = make_app(model_path=str(vision_path))
    view, action = app.window.chat, app.window.pan_and_scan_action
    wait_loaded(qtbot, app)
    assert action.isCheckable() and not action.isChecked()
    wide = IMAGES / "wide.png"
    assert drop_files(view, wide) and checked(qtbot, app) == ["wide.png"]
    seen = Answers(app)
    qtbot.keyClicks(view.input, QUESTION)
    finish(qtbot, app, lambda: qtbot.keyClick(view.input, Qt.Key.Key_Return))
    data = wide.read_bytes()
    keys = [k for k, _ in vision_model.vision.encode_with_crops(data, True)]
    assert len(keys) == 4 and seen.started[0]["images"] == keys[:1]
    expected_off = engine_answer(vision_model, [user_turn([data], QUESTION)])
    assert seen.text() == expected_off

    action.trigger()  # Settings → Pan-and-scan pictures
    assert action.isChecked() and SettingsModel(home).values.pan_and_scan is True
    finish(qtbot, app, lambda: qtbot.mouseClick(view.regenerate_button, Qt.MouseButton.LeftButton))
    assert seen.started[1]["images"] == keys
    part = {"type": "image", "image": data, "pan_and_scan": True}
    expected_on = engine_answer(vision_model, [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}])
    assert seen.text() == expected_off + expected_on
    assert seen.started[1]["prompt"] != seen.started[0]["prompt"]  # the processor's words around the crops


def test_bad_files_are_refused_when_attached(qtbot, make_app, home, tmp_path, monkeypatch):
    app = make_app(autoload=False)
    view = app.window.chat
    whole = (IMAGES / "portrait_rgba.png").read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole[: len(whole) // 2])
    notes = tmp_path / "notes.txt"
    notes.write_text("not a picture")
    assert drop_files(view, cut, IMAGES / "gray.png")
    assert checked(qtbot, app) == ["gray.png"]  # the good one is still attached
    assert (
        view.notice_kind() == "error"
        and "damaged or truncated" in view.notice.text()
        and "cut.png" in view.notice.text()
    )
    monkeypatch.setattr(
        attachments_controller.QFileDialog, "getOpenFileNames", lambda *args, **kwargs: ([str(notes)], "")
    )
    qtbot.mouseClick(view.attach_button, Qt.MouseButton.LeftButton)
    assert checked(qtbot, app) == ["gray.png"]
    assert "not an image Phoenix Chat reads" in view.notice.text()
    # a file dropped on the message box is attached too, not typed in as its path
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(IMAGES / "small.webp"))])
    assert drop(view.input.viewport(), mime)
    assert checked(qtbot, app) == ["gray.png", "small.webp"] and view.input.toPlainText() == ""
    # a picture dragged from a web page or an editor comes as image data
    data = QMimeData()
    data.setImageData(QImage(str(IMAGES / "portrait_rgba.png")))
    assert drop(view, data)
    assert checked(qtbot, app) == ["gray.png", "small.webp", "pasted image.png"]
    qtbot.mouseClick(view.attachments.findChildren(QToolButton, "removeAttachment")[2], Qt.MouseButton.LeftButton)
    assert view.attachment_names() == ["gray.png", "small.webp"]
    mime = QMimeData()
    # text dropped or pasted is still text
    mime.setText("plain words")
    view.input.insertFromMimeData(mime)
    assert view.input.toPlainText() == "plain words" and view.attachment_names() == ["gray.png", "small.webp"]


def test_the_text_only_model_says_it_has_no_image_input(qtbot, make_app, home):
    """The embedded 270M: the answer fails with the engine's one line, the message and its
    picture are saved; the same chat goes on without the picture (said), and a new chat answers."""
    preset(home, backend="cpu", max_tokens=3, temperature=0.0)
    app = make_app()
    view = app.window.chat
    wait_loaded(qtbot, app)
    assert drop_files(view, IMAGES / "small.webp") and checked(qtbot, app) == ["small.webp"]
    # said when the picture is attached, and again (the engine's line) when the answer fails
    assert view.notice_kind() == "warning" and "this model has no image input" in view.notice.text()
    qtbot.keyClicks(view.input, "What is this?")
    _, reason = finish(qtbot, app, lambda: qtbot.keyClick(view.input, Qt.Key.Key_Return))
    assert reason == "error"
    assert (
        view.notice_kind() == "error"
        and "The engine reported an error: this model has no image input: " in view.notice.text()
    )
    app.store.flush()
    user = app.chat.messages[0]
    assert (user.content, [i.name for i in user.images]) == ("What is this?", ["small.webp"])
    assert image_rows(home) == [(user.id, (IMAGES / "small.webp").read_bytes())]
    # the same chat goes on: the earlier picture is left out of the prompt (said in the status
    # bar), kept in the history; the engine reads the two text turns without an image token
    seen = Answers(app)
    with qtbot.waitSignal(app.worker.notice_raised, timeout=ANSWER_TIMEOUT_MS) as note:
        _, reason = finish(qtbot, app, lambda: app.chat.send("The capital of France is"))
    assert note.args[1].startswith("1 earlier picture left out of the prompt: this model has no image input: ")
    assert reason in ("length", "stop") and seen.text().strip()
    assert seen.started[-1]["images"] == [] and "<start_of_image>" not in seen.started[-1]["prompt"]
    assert "What is this?" in seen.started[-1]["prompt"] and "The capital of France is" in seen.started[-1]["prompt"]
    assert "left out of the prompt" in app.window.statusBar().currentMessage()
    assert [i.name for i in app.chat.messages[0].images] == ["small.webp"]
    app.chat.new_conversation()
    seen = Answers(app)
    _, reason = finish(qtbot, app, lambda: app.chat.send("The capital of France is"))
    assert reason in ("length", "stop") and seen.text().strip()


@pytest.fixture(scope="module")
def served_vision(vision_path):
    """The tiny vision model behind a real `serve` on 127.0.0.1 (its own copy: a scheduler must
    be the only writer to its model)."""
    model = load(vision_path, backend="cpu")
    scheduler = Scheduler(model)
    with start_server(scheduler, ServerConfig(port=0)) as running:
        yield running
    scheduler.close()
    model.close()


def test_pictures_go_to_a_remote_server_as_data_urls(qtbot, make_app, home, served_vision, vision_model):
    """A remote engine (here Phoenix Chat's own server) gets the pictures as OpenAI image_url
    parts: its answer is the engine's greedy answer for that picture."""
    preset(
        home,
        max_tokens=ANSWER,
        temperature=0.0,
        remote_profiles=[{"name": "box", "url": served_vision.url, "model": None}],
        remote_profile="box",
        engine="remote",
    )
    app = make_app(secrets=SecretStore(MemoryKeyring()))
    view = app.window.chat
    wait_loaded(qtbot, app)
    picture = IMAGES / "exif_rotated.jpg"
    assert drop_files(view, picture) and checked(qtbot, app) == ["exif_rotated.jpg"]
    qtbot.keyClicks(view.input, QUESTION)
    _, reason = finish(qtbot, app, lambda: qtbot.keyClick(view.input, Qt.Key.Key_Return))
    user, answer = app.chat.messages
    assert reason == "length" and answer.engine is not None and answer.engine.startswith("remote:")
    assert answer.content == engine_answer(vision_model, [user_turn([picture.read_bytes()], QUESTION)])
    assert [i.name for i in user.images] == ["exif_rotated.jpg"]


def test_a_chat_with_pictures_longer_than_the_context_leaves_out_its_oldest_messages(
    qtbot, make_app, home, vision_path, vision_model
):
    """The tiny model's 512-token context: the second turn does not fit with the first, so the
    model reads the second message alone (its picture included), as a text chat is fitted."""
    preset(home, backend="cpu", max_tokens=ANSWER, temperature=0.0)
    app = make_app(model_path=str(vision_path))
    view = app.window.chat
    wait_loaded(qtbot, app)
    long_text = "apple " * 460  # with its picture, 488 of the 506 tokens a prompt may take here
    assert drop_files(view, IMAGES / "gray.png") and checked(qtbot, app) == ["gray.png"]
    seen = Answers(app)
    finish(qtbot, app, lambda: app.chat.send(long_text))
    assert seen.started[0]["images"] == [key(vision_model, (IMAGES / "gray.png").read_bytes())]
    second = (IMAGES / "small.webp").read_bytes()
    assert drop_files(view, IMAGES / "small.webp") and checked(qtbot, app) == ["small.webp"]
    fitted = []
    app.worker.prompt_fitted.connect(lambda _id, info: fitted.append(info))
    finish(qtbot, app, lambda: app.chat.send("And this one?"))
    assert fitted and fitted[0]["dropped_messages"] == 2
    assert seen.started[1]["images"] == [key(vision_model, second)]
    answer = app.chat.messages[-1].content
    assert answer == engine_answer(vision_model, [user_turn([second], "And this one?")])
    assert "without 2 earlier messages" in view.transcript_text()
    assert [len(m.images) for m in app.chat.messages] == [1, 0, 1, 0]  # the history keeps everything
