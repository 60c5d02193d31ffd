"""What a built CUDA artifact holds: the GPU binaries TVM embedded in the shared library, their
architecture and their kernels, read from the bytes alone (no CUDA tools or driver needed).

TVM embeds the CUDA module's code in the library; built with nvcc it is a fatbin (a container of
one ELF cubin per architecture, or PTX), built with NVRTC a bare cubin. The fatbin container and
entry headers are NVIDIA's ``fatbinary`` layout; a cubin is an ELF file (machine EM_CUDA) whose
function symbols are the kernels.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
_ENTRY_HEADER = struct.Struct("<HHIQ")  # kind, version, header size, payload size
_ENTRY_ARCH_OFFSET = 28
_ENTRY_FLAGS_OFFSET = 40
_COMPRESSED = 0x2000
_KIND_PTX, _KIND_CUBIN = 1, 2
_ELF_MAGIC = b"\x7fELF"
_EM_CUDA = 190
_STT_FUNC = 2


@dataclass(frozen=True)
class GpuBinary:
    kind: str  # "cubin" or "ptx"
    arch: str  # "sm_90"
    kernels: tuple[str, ...]  # function symbols of a cubin (empty for PTX or a compressed entry)
    compressed: bool = False
    image: bytes = field(default=b"", repr=False, compare=False)  # a cubin's ELF image (not a compressed one's)


def gpu_binaries(artifact: str | Path) -> list[GpuBinary]:
    """The GPU binaries embedded in a built library: each fatbin's entries, or bare cubins."""
    data = Path(artifact).read_bytes()
    found: list[GpuBinary] = []
    covered: list[range] = []
    start = 0
    magic = struct.pack("<I", FATBIN_MAGIC)
    while (at := data.find(magic, start)) >= 0:
        _, _, header_size, size = _FATBIN_HEADER.unpack_from(data, at)
        found += _fatbin_entries(data, at + header_size, at + header_size + size)
        covered.append(range(at, at + header_size + size))
        start = at + header_size + size
    start = 1  # offset 0 is the host library's own ELF header
    while (at := data.find(_ELF_MAGIC, start)) >= 0:
        start = at + 1
        if any(at in span for span in covered) or len(data) < at + 64:
            continue
        machine, flags = struct.unpack_from("<H", data, at + 18)[0], struct.unpack_from("<I", data, at + 48)[0]
        if machine == _EM_CUDA:
            image = data[at : at + _elf_size(data[at:])]
            found.append(GpuBinary("cubin", _elf_arch(flags, data[at + 8]), _elf_functions(image), image=image))
    return found


def _fatbin_entries(data: bytes, start: int, end: int) -> list[GpuBinary]:
    entries = []
    while start + _ENTRY_HEADER.size <= end:
        kind, _, header_size, payload_size = _ENTRY_HEADER.unpack_from(data, start)
        if header_size == 0:
            break
        arch = struct.unpack_from("<I", data, start + _ENTRY_ARCH_OFFSET)[0]
        compressed = bool(struct.unpack_from("<Q", data, start + _ENTRY_FLAGS_OFFSET)[0] & _COMPRESSED)
        payload = data[start + header_size : start + header_size + payload_size]
        kernels = (
            _elf_functions(payload) if kind == _KIND_CUBIN and not compressed and payload.startswith(_ELF_MAGIC) else ()
        )
        entries.append(
            GpuBinary(
                "cubin" if kind == _KIND_CUBIN else "ptx" if kind == _KIND_PTX else f"kind {kind}",
                f"sm_{arch}",
                kernels,
                compressed,
                payload if kind == _KIND_CUBIN and not compressed else b"",
            )
        )
        start += header_size + payload_size
    return entries


def _elf_arch(flags: int, abi_version: int) -> str:
    """The SM of a cubin from its ELF flags: bits 8-15 from ELF ABI version 8 (CUDA 12.8+), bits 0-7 before."""
    return f"sm_{(flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF}"


def _elf_functions(elf: bytes) -> tuple[str, ...]:
    """Names of the function symbols of a 64-bit little-endian ELF image."""
    return elf_symbols(elf, _STT_FUNC)


def elf_symbols(elf: bytes, kind: int | None = None) -> tuple[str, ...]:
    """Names of the symbols of a 64-bit little-endian ELF image (a cubin), those of type ``kind`` only if given."""
    sections = _section_headers(elf)
    names = []
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 2 or entsize == 0:  # SHT_SYMTAB
            continue
        strings = _section_bytes(elf, sections[link])
        for at in range(offset, offset + size, entsize):
            name_at, info = struct.unpack_from("<IB", elf, at)
            if kind is None or info & 0xF == kind:
                names.append(_name_at(strings, name_at))
    return tuple(names)


def elf_sections(elf: bytes) -> dict[str, bytes]:
    """The sections of a 64-bit little-endian ELF image by name: a cubin's machine code is in ``.text.KERNEL``."""
    sections = _section_headers(elf)
    names = _section_bytes(elf, sections[struct.unpack_from("<H", elf, 62)[0]])  # e_shstrndx
    return {_name_at(names, header[0]): _section_bytes(elf, header) for header in sections[1:]}


def _elf_size(elf: bytes) -> int:
    """Bytes of the ELF image at the start of ``elf``: to the end of its last section or section header."""
    shoff, shentsize, shnum = _header_table(elf)
    ends = [offset + (0 if sh_type == 8 else size) for _, sh_type, _, _, offset, size, *_ in _section_headers(elf)]
    return max([shoff + shnum * shentsize, *ends])


def _header_table(elf: bytes) -> tuple[int, int, int]:
    """Where an ELF image's section headers start, the size of one, and how many there are."""
    return struct.unpack_from("<Q", elf, 40)[0], *struct.unpack_from("<HH", elf, 58)


def _section_headers(elf: bytes) -> list[tuple]:
    shoff, shentsize, shnum = _header_table(elf)
    return [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]


def _section_bytes(elf: bytes, header: tuple) -> bytes:
    _, sh_type, _, _, offset, size = header[:6]
    return b"" if sh_type == 8 else elf[offset : offset + size]  # SHT_NOBITS: no bytes in the file


def _name_at(strings: bytes, at: int) -> str:
    return strings[at : strings.index(b"\0", at)].decode()
