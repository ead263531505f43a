"""Chat messages → prompt text and prompt ids.

The model's own Jinja chat template is used when the file carries one (rendered the way
transformers does: sandboxed, `bos_token`, `raise_exception`); Gemma 3's format otherwise:

    <bos><start_of_turn>user\\n{system}\\n\\n{user}<end_of_turn>\\n<start_of_turn>model\\n

Message text is data, not markup. `encode` never lets message content produce a control token:
- Gemma fallback: the prompt is built as parts; the template's markers become ids directly and
  all text between two markers is tokenized with special-token parsing off;
- Jinja template: every special-token string inside message values is broken with an invisible
  guard character before rendering, the rendered text is split at the special tokens that remain
  (the template's own), the guards are removed and each text run is tokenized with parsing off.
Both give exactly llama.cpp's ids for the rendered text whenever the content holds no markers.

Images: a content part `{"type": "image", "image": <path or bytes>}` renders as the template's
`<start_of_image>` (Gemma's fallback does the same); `encode(..., images=ImageLayout(...))` then
expands each into what Gemma 3's processor writes: "\\n\\n", `<start_of_image>`, the soft-token
placeholders, `<end_of_image>`, "\\n\\n" — the newlines joined with the neighbouring text before
tokenizing, as the processor's text replacement does. Only the template's own markers become
images (message text is guarded as above). A picture with pan-and-scan crops (`crops=`, one count
per image part) becomes the processor's "Here is the original image " + that sequence +
" and here are some crops to help you see better " + one sequence per crop, joined by " ".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from .errors import PhoenixError

if TYPE_CHECKING:
    from jinja2 import Template

    from .tokenizer import Tokenizer

START_OF_TURN = "<start_of_turn>"
START_OF_IMAGE = "<start_of_image>"
END_OF_IMAGE = "<end_of_image>"
END_OF_TURN = "<end_of_turn>"
# Gemma3Processor's words around a picture with pan-and-scan crops
PAS_ORIGINAL = "Here is the original image "
PAS_CROPS = " and here are some crops to help you see better "

# U+FDD0 is a Unicode noncharacter: never valid in interchanged text, safe to drop from input
_GUARD = "\ufdd0"


class ChatTemplateError(PhoenixError):
    """The conversation does not fit the model's chat format, or the template is broken."""


@dataclass(frozen=True)
class _Part:
    text: str
    marker: bool  # a control token of the template (becomes one id)
    token_id: int | None = None  # a marker's id where it is not looked up by its text


@dataclass(frozen=True)
class ImageLayout:
    """How one image sits in the prompt (engine/vision_config.py has the model's values)."""

    boi_id: int  # <start_of_image>
    eoi_id: int  # <end_of_image>
    image_id: int  # the placeholder each soft token replaces
    tokens: int  # soft tokens per image


class ChatFormat:
    """Renders and tokenizes conversations `[{"role": ..., "content": ...}, ...]`."""

    def __init__(
        self,
        template: str | None = None,
        bos_token: str = "<bos>",
        eos_token: str = "<eos>",
        tokenizer: Tokenizer | None = None,
        **template_vars: Any,
    ) -> None:
        self.template_source = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.tokenizer = tokenizer
        self.template_vars = template_vars
        self._template = _compile(template) if template else None

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> ChatFormat:
        """The format a model's tokenizer implies: its chat template, else Gemma 3's."""
        return cls(
            tokenizer.chat_template,
            bos_token=tokenizer.bos_token or "",
            eos_token=tokenizer.eos_token or "",
            tokenizer=tokenizer,
        )

    @property
    def uses_model_template(self) -> bool:
        return self._template is not None

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt as text (for display, logs and the CLI's `--verbose`)."""
        messages = normalize_messages(messages)
        if self._template is not None:
            return self._render_jinja(messages, add_generation_prompt)
        return "".join(p.text for p in self._gemma_parts(messages, add_generation_prompt))

    def encode(
        self,
        messages: Sequence[Mapping[str, Any]],
        tokenizer: Tokenizer | None = None,
        add_generation_prompt: bool = True,
        images: ImageLayout | None = None,
        crops: Sequence[int] = (),
    ) -> list[int]:
        """Prompt ids; message content never turns into control tokens (see the module doc).
        images: the model's image layout; without it a message with an image part is refused.
        crops: each image part's pan-and-scan crops, in order (none given: no crops)."""
        tokenizer = tokenizer or self.tokenizer
        if tokenizer is None:
            raise ValueError("ChatFormat.encode needs a tokenizer")
        messages = normalize_messages(messages)
        wanted = count_images(messages)
        if wanted and images is None:
            raise ChatTemplateError("this conversation has images and this model has no image input")
        if self._template is None:
            parts = self._gemma_parts(messages, add_generation_prompt)
        else:
            parts = self._jinja_parts(messages, add_generation_prompt, tokenizer)
        if images is not None:
            parts = _expand_images(parts, images, wanted, crops)
        return _encode_parts(parts, tokenizer)

    # -- Gemma 3 ----------------------------------------------------------------------------
    def _gemma_parts(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> list[_Part]:
        messages = list(messages)
        prefix = ""
        if messages and messages[0].get("role") == "system":
            prefix = _content_text(messages[0]) + "\n\n"
            messages = messages[1:]
            if not messages:  # a system prompt alone still reaches the model
                messages = [{"role": "user", "content": ""}]
        parts = [_Part(self.bos_token, True)] if self.bos_token else []
        for i, msg in enumerate(messages):
            role = msg.get("role")
            expected = "user" if i % 2 == 0 else "assistant"
            if role == "model":
                role = "assistant"
            if role != expected:
                raise ChatTemplateError(
                    "Gemma's chat format needs one optional system message first, then user and "
                    f"assistant turns alternating, starting with user (message {i + 1} is {role!r})"
                )
            turn_role = "model" if role == "assistant" else "user"
            parts += [
                _Part(START_OF_TURN, True),
                _Part(turn_role + "\n" + (prefix if i == 0 else ""), False),
                *_content_parts(msg),
                _Part(END_OF_TURN, True),
                _Part("\n", False),
            ]
        if add_generation_prompt:
            parts += [_Part(START_OF_TURN, True), _Part("model\n", False)]
        return parts

    # -- Jinja ------------------------------------------------------------------------------
    def _render_jinja(self, messages: Sequence[object], add_generation_prompt: bool) -> str:
        assert self._template is not None  # only called when the model has a template
        try:
            return self._template.render(
                messages=list(messages),
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                add_generation_prompt=add_generation_prompt,
                **self.template_vars,
            )
        except ChatTemplateError:
            raise
        except Exception as e:  # a template bug is the model file's problem, report it as such
            raise ChatTemplateError(f"the model's chat template failed: {type(e).__name__}: {e}") from None

    def _jinja_parts(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, tokenizer: Tokenizer
    ) -> list[_Part]:
        pattern = _marker_pattern(tokenizer)

        def guard(value: object) -> object:
            if isinstance(value, str):
                value = value.replace(_GUARD, "")
                return pattern.sub(lambda m: m.group(0)[0] + _GUARD + m.group(0)[1:], value)
            if isinstance(value, Mapping):
                return {k: guard(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [guard(v) for v in value]
            return value

        rendered = self._render_jinja([guard(_without_image_data(m)) for m in messages], add_generation_prompt)
        parts: list[_Part] = []
        pos = 0
        for m in pattern.finditer(rendered):
            parts += [_Part(rendered[pos : m.start()].replace(_GUARD, ""), False), _Part(m.group(0), True)]
            pos = m.end()
        parts.append(_Part(rendered[pos:].replace(_GUARD, ""), False))
        return parts


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What every format gets: system messages with blank text dropped, and consecutive text
    messages of one role joined with a blank line (a chat whose answer came back empty would
    otherwise hold two user turns in a row, which Gemma's templates refuse)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        msg = dict(msg)
        content = msg.get("content")
        if msg.get("role") == "system" and isinstance(content, str) and not content.strip():
            continue
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.get("role") == msg.get("role")
            and isinstance(content, str)
            and isinstance(prev.get("content"), str)
            and set(prev) == set(msg) == {"role", "content"}
        ):
            prev["content"] = prev["content"] + "\n\n" + content
            continue
        out.append(msg)
    return out


def _marker_pattern(tokenizer: Tokenizer) -> re.Pattern[str]:
    """The special tokens, and the image markers also where the vocabulary does not flag them
    special (GGUF-derived vocabularies): message text must never place a picture either."""
    extra = [t for t in (START_OF_IMAGE, END_OF_IMAGE) if tokenizer.token_to_id(t) is not None]
    if not extra:
        return tokenizer.special_pattern
    return re.compile("|".join([*map(re.escape, extra), tokenizer.special_pattern.pattern]))


def is_image_part(item: object) -> bool:
    return isinstance(item, Mapping) and item.get("type") == "image"


def count_images(messages: Sequence[Mapping[str, Any]]) -> int:
    """Image parts in a conversation (content given as a list of parts)."""
    n = 0
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, Sequence) and not isinstance(content, str):
            n += sum(1 for item in content if is_image_part(item))
    return n


def _without_image_data(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """The message as the template sees it: an image part's payload (a path, bytes) left out."""
    content = message.get("content")
    if isinstance(content, str) or not isinstance(content, Sequence):
        return message
    return {**message, "content": [{"type": "image"} if is_image_part(i) else i for i in content]}


def _expand_images(parts: list[_Part], layout: ImageLayout, wanted: int, crops: Sequence[int]) -> list[_Part]:
    """Each `<start_of_image>` marker -> the processor's full image sequence, or with crops the
    original's and each crop's with the processor's words around them (module doc)."""
    if crops and len(crops) != wanted:
        raise ChatTemplateError(f"{len(crops)} crop counts for the {wanted} image(s) in the conversation")
    sequence = [
        _Part("\n\n", False),
        _Part(START_OF_IMAGE, True, layout.boi_id),
        *[_Part("", True, layout.image_id)] * layout.tokens,
        _Part(END_OF_IMAGE, True, layout.eoi_id),
        _Part("\n\n", False),
    ]
    out: list[_Part] = []
    found = 0
    for part in parts:
        if not (part.marker and part.text == START_OF_IMAGE):
            out.append(part)
            continue
        n = crops[found] if crops and found < len(crops) else 0
        found += 1
        if not n:
            out += sequence
            continue
        out += [_Part(PAS_ORIGINAL, False), *sequence, _Part(PAS_CROPS, False), *sequence]
        for _ in range(n - 1):
            out += [_Part(" ", False), *sequence]
    if found != wanted:
        raise ChatTemplateError(f"the chat template placed {found} image(s) for the {wanted} in the conversation")
    return out


def _encode_parts(parts: list[_Part], tokenizer: Tokenizer) -> list[int]:
    """Markers → their ids; each run of text between markers → ids with special parsing off."""
    ids: list[int] = []
    text: list[str] = []

    def flush_text() -> None:
        if text:
            ids.extend(tokenizer.encode("".join(text), add_bos=False, parse_special=False))
            text.clear()

    for part in parts:
        if not part.marker:
            text.append(part.text)
            continue
        flush_text()
        token_id = part.token_id if part.token_id is not None else tokenizer.token_to_id(part.text)
        if token_id is None:
            raise ChatTemplateError(f"the chat format uses {part.text!r}, which this model's vocabulary lacks")
        ids.append(token_id)
    flush_text()
    return ids


def _content_parts(message: Mapping[str, Any]) -> list[_Part]:
    """A turn's content for Gemma's fallback format: text trimmed (per part, as Gemma 3's
    template does), each image part as the `<start_of_image>` marker."""
    content = message.get("content", "")
    if isinstance(content, Sequence) and not isinstance(content, str):
        return [
            _Part(START_OF_IMAGE, True) if is_image_part(item) else _Part(_text_item(item), False) for item in content
        ]
    return [_Part(_content_text(message).strip(), False)]


def _text_item(item: object) -> str:
    if not isinstance(item, Mapping) or item.get("type") != "text":
        raise ChatTemplateError("message content parts must be text or image")
    return str(item.get("text", "")).strip()


def _content_text(message: Mapping[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # [{"type": "text", "text": ...}, ...]
        texts = []
        for item in content:
            if not isinstance(item, Mapping) or item.get("type") != "text":
                raise ChatTemplateError("only text message content is supported")
            texts.append(str(item.get("text", "")).strip())
        return "".join(texts)
    raise ChatTemplateError(f"message content must be text, not {type(content).__name__}")


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(f"the model's chat template refused the conversation: {message}")


def _compile(source: str) -> Template:
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    # as transformers: keep non-ASCII as is (a "\\u..." escape would hide the guard character)
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as e:
        raise ChatTemplateError(f"the model's chat template does not compile: {e}") from None
