"""The weight types a model can be re-quantized to on load: one enum for the engine, the CLI
and the app (settings, menus, worker), so a choice is spelt the same way everywhere.

`WeightQuant.parse` is the only door in: it accepts the enum, its value in any case
("Q8_0" from an old settings file) and None/"file" (keep the file's own types), and turns
anything else into a `PhoenixError` the user can read, before a backend is chosen.
No numpy or gguf at import: the app's settings read this at start-up.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from phoenix_chat.engine.errors import PhoenixError

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType as QType

AS_IN_FILE = "file"  # the spelling of "no re-quantization" in settings and model info


class WeightQuant(str, Enum):  # str: equal to its value (3.10 has no StrEnum)
    """A target type for every weight matrix (norms stay f32)."""

    # smallest first: the order of the menu, the --quant choices and error messages
    Q4_0 = "q4_0"  # 4.5 bits a weight: f16 scale, symmetric
    Q4_1 = "q4_1"  # 5.0: f16 scale and minimum (min/max grid of 16 levels)
    Q5_1 = "q5_1"  # 6.0: f16 scale and minimum, 32 levels
    Q8_0 = "q8_0"
    F16 = "f16"

    @property
    def qtype(self) -> QType:
        """The matrices' GGML type."""
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType[self.name]

    @property
    def embedding_qtype(self) -> QType:
        """The embedding table's type: Q8_0 under Q4_0, Q4_1 and Q5_1, the type of the matrices otherwise.

        Gemma's embedding is tied (it is also the output head). llama.cpp's quantizer never gives
        that tensor the 4/5-bit type of a Q4_0, Q4_1 or Q5_1 file (llama-quant.cpp, the
        output/tied-embedding rule): Q6_K where its rows are whole 256-value super-blocks (27B:
        5376), Q8_0 where not (270M: 640). gguf-py cannot make Q6_K and our device quantizer
        makes only what gguf-py makes, so Q8_0 it is in every case: llama.cpp's own choice for the
        270M, one step above it for the 27B."""
        return WeightQuant.Q8_0.qtype if self in _EIGHT_BIT_EMBEDDING else self.qtype

    @property
    def label(self) -> str:
        """How the UI and messages write it: Q4_0, Q4_1, Q5_1, Q8_0, F16."""
        return self.name

    @classmethod
    def parse(cls, value: str | WeightQuant | None) -> WeightQuant | None:
        """The choice as an enum, or None for "as in the file". Case-insensitive."""
        if value is None or isinstance(value, WeightQuant):
            return value
        text = str(value).strip().lower()
        if text in ("", AS_IN_FILE):
            return None
        try:
            return cls(text)
        except ValueError:
            choices = ", ".join(q.value for q in cls)
            raise PhoenixError(f"unknown quantization {value!r} (choose from {choices}, or {AS_IN_FILE})") from None


_EIGHT_BIT_EMBEDDING = (WeightQuant.Q4_0, WeightQuant.Q4_1, WeightQuant.Q5_1)


def quant_name(quant: WeightQuant | None) -> str:
    """The value model info and settings carry: the enum's value, or "file"."""
    return AS_IN_FILE if quant is None else quant.value
