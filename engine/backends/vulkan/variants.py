"""The vocabulary of the pipeline table: `PushLayout` (a push-constant block) and `Variant` (one
compiled shader variant). The lowest module of the table: `pipelines.py` and `ops_table.py` both
declare their variants with these, and `bench/` declares its probe kernels with them too.

Push constants are defined with `PushLayout` only: `PushLayout.glsl()` generates the GLSL block
that the build passes to the shader as the macro PUSH_CONSTANTS, and the layout's size is checked
against the 128 bytes every Vulkan device guarantees.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from phoenix_chat.shaders import SHADER_DIR

MAX_PUSH_BYTES = 128  # the minimum maxPushConstantsSize every device offers

_SCALARS = {"u32": ("I", "uint"), "i32": ("i", "int"), "f32": ("f", "float")}


class PushLayout:
    """A block of 4-byte scalars, in declaration order (std430: no padding): a push-constant
    block (`glsl()`), or a struct in a buffer such as the step buffer's (`struct_glsl()`).
    A field is (name, type) or (name, type, comment); the comment goes into the struct's GLSL."""

    def __init__(self, name: str, fields: Sequence[tuple[str, str] | tuple[str, str, str]]):
        self.name = name
        self.fields: list[tuple[str, str]] = [(f[0], f[1]) for f in fields]
        self.comments: dict[str, str] = {f[0]: f[2] for f in fields if len(f) > 2}
        for f, t in self.fields:
            if t not in _SCALARS:
                raise ValueError(f"push layout {name}: field {f} has unknown type {t}")
        self.names = [f for f, _ in self.fields]
        self._struct = struct.Struct("<" + "".join(_SCALARS[t][0] for _, t in self.fields))
        self.size = self._struct.size
        if self.size > MAX_PUSH_BYTES:
            raise ValueError(f"push layout {name} is {self.size} B > {MAX_PUSH_BYTES} B")

    def pack(self, **values: float) -> bytes:
        """Bytes for vkCmdPushConstants; every field must be given (missing or extra raise)."""
        extra = set(values) - set(self.names)
        missing = set(self.names) - set(values)
        if extra or missing:
            raise KeyError(f"push layout {self.name}: missing {sorted(missing)}, unknown {sorted(extra)}")
        return self._struct.pack(*(values[f] for f in self.names))

    def unpack(self, data: bytes) -> dict[str, int | float]:
        return dict(zip(self.names, self._struct.unpack(bytes(data[: self.size]))))

    def glsl(self) -> str:
        body = " ".join(f"{_SCALARS[t][1]} {f};" for f, t in self.fields)
        return f"layout(push_constant) uniform PC_{self.name} {{ {body} }} pc;"

    def struct_glsl(self) -> str:
        """`struct <name> { ... };`, one field a line, comments aligned in one column."""
        lines = [f"struct {self.name} {{"]
        for f, t in self.fields:
            decl = f"{_SCALARS[t][1]} {f};"
            lines.append(f"    {decl:<21}// {self.comments[f]}" if f in self.comments else f"    {decl}")
        return "\n".join(lines + ["};"])


NO_PUSH = PushLayout("none", [])


@dataclass(frozen=True)
class Variant:
    name: str  # op_wtype_atype_otype[_variant]
    shader: str  # file in `home` (shaders/)
    bindings: int  # storage buffers at bindings 0..n-1
    push: PushLayout = NO_PUSH
    defines: Mapping[str, str | int | None] = field(default_factory=dict)
    spec: dict[str, tuple[int, int]] = field(default_factory=dict)  # spec name -> (constant_id, default int)
    requires: tuple[str, ...] = ()  # capability names (Capabilities attributes) needed
    home: Path = SHADER_DIR  # folder of `shader`; the SPIR-V is in its spv/

    def define_args(self) -> list[str]:
        args = [f"-D{k}" if v is None or v == "" else f"-D{k}={v}" for k, v in sorted(self.defines.items())]
        if self.push.fields:
            args.append(f"-DPUSH_CONSTANTS={self.push.glsl()}")
        else:
            args.append("-DPUSH_CONSTANTS=")
        return args

    @property
    def source(self) -> Path:
        return self.home / self.shader

    @property
    def spv_path(self) -> Path:
        return self.home / "spv" / f"{self.name}.spv"
