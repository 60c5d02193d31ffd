"""Translate the targets users write ("llvm", "cuda -arch=sm_90", dicts, tags) into TVM 0.27 Targets.

TVM 0.27 accepts only the dict form; the old CLI form ("llvm -num-cores 2") is rejected, so it is
parsed here. A bare "llvm" means the host CPU with its vector extensions (``mcpu``): without it
LLVM emits SSE only and the same schedule runs several times slower.
"""

from __future__ import annotations

import difflib
import re
import shlex
from typing import Any

import tvm
from tvm.target import Target
from tvm.target import codegen as llvm_features

from codegen.bf16_dot import AMX, AVX512
from common.error_text import error_line
from common.host import cpu_flags, physical_cores
from measure.cuda.runtime import no_gpu_reason, runtime_problem

from .errors import TargetError

SUPPORTED_KINDS = ("llvm", "cuda")
_LIST_OPTIONS = {"mattr", "keys", "libs"}
_EXAMPLES = (
    "'llvm', 'llvm -mcpu=skylake-avx512 -num-cores=4', 'cuda', 'cuda -arch=sm_90', or a dict like {'kind': 'cuda', "
    "'arch': 'sm_90'}"
)
# Vector features LLVM may emit code for, as /proc/cpuinfo names them and as LLVM does: LLVM names the host CPU
# by its model number, which a hypervisor may report for an older CPU (a Sapphire Rapids seen as a Rocket Lake, without
# its bf16 dot product and AMX), or offer less than the model has (an Emerald Rapids with AMX off: its tiles'
# instructions stop the process), so the host's target adds those its CPU name lacks and removes those the
# CPU does not offer.
_HOST_FEATURES = {
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",  # removed, it takes every AVX-512 feature with it (a hypervisor that hides AVX-512)
    "avx512dq": "avx512dq",
    "avx512cd": "avx512cd",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512_vbmi2": "avx512vbmi2",
    "avx512_vnni": "avx512vnni",
    "avx512_bitalg": "avx512bitalg",
    "avx512_vpopcntdq": "avx512vpopcntdq",
    "avx512_fp16": "avx512fp16",
    "avx512_bf16": "avx512bf16",
    "amx_tile": "amx-tile",
    "amx_bf16": "amx-bf16",
    "amx_int8": "amx-int8",
    "avx_vnni": "avxvnni",
}
# Limits of every CUDA GPU since Volta, used where the device cannot be asked (a build host without a GPU).
_CUDA_DEFAULT_LIMITS = {
    "max_shared_memory_per_block": 49152,
    "max_threads_per_block": 1024,
    "registers_per_block": 65536,
    "thread_warp_size": 32,
}


BF16_FEATURE = "avx512bf16"  # LLVM's name; /proc/cpuinfo says avx512_bf16
AMX_FEATURES = ("amx-tile", "amx-bf16")  # /proc/cpuinfo: amx_tile, amx_bf16


def requested_config(spec: str | dict | Target) -> dict[str, Any]:
    """The options ``spec`` names itself, before the host's are filled in (TargetError if unreadable)."""
    if isinstance(spec, Target):
        return _config_of(spec)
    if isinstance(spec, dict):
        return dict(spec)
    if isinstance(spec, str) and spec.strip():
        return _parse_string(spec.strip())
    raise TargetError(f"invalid target {spec!r}: use {_EXAMPLES}")


def resolve_target(spec: str | dict | Target) -> Target:
    """Return a complete TVM Target for ``spec``, or raise TargetError naming the problem."""
    config = requested_config(spec)
    kind = config.get("kind")
    if kind not in SUPPORTED_KINDS:
        raise TargetError(
            f"unsupported target kind {kind!r} in {spec!r}: the tuner supports {', '.join(SUPPORTED_KINDS)}; use "
            f"{_EXAMPLES}"
        )
    config = _complete_llvm(config) if kind == "llvm" else _complete_cuda(config)
    try:
        return Target(config)
    except (ValueError, RuntimeError) as err:
        raise TargetError(f"invalid target {spec!r}: {error_line(err)}; use {_EXAMPLES}") from err


def _parse_string(text: str) -> dict[str, Any]:
    if text.startswith("{"):
        raise TargetError(f"invalid target {text!r}: pass a dict object, not its JSON text, or use {_EXAMPLES}")
    tokens = shlex.split(text)
    kind = tokens[0]
    if "/" in kind and len(tokens) == 1:  # a tag such as "nvidia/nvidia-h100"
        try:
            return _config_of(Target(kind))
        except (ValueError, RuntimeError) as err:
            raise TargetError(f"unknown target tag {kind!r}: use {_EXAMPLES}") from err
    config: dict[str, Any] = {"kind": kind}
    i = 1
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("-"):
            raise TargetError(f"invalid target {text!r}: expected an option like -key=value, found {token!r}")
        key = token.lstrip("-")
        if "=" in key:
            key, value = key.split("=", 1)
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            value = tokens[i + 1]
            i += 1
        else:
            value = "true"
        config[key] = _parse_value(key, value)
        i += 1
    return config


def _parse_value(key: str, value: str) -> Any:
    if key in _LIST_OPTIONS:
        return [v for v in value.split(",") if v]
    if value.lstrip("-").isdigit():
        return int(value)
    if value in ("true", "false"):
        return value == "true"
    return value


def _config_of(target: Target) -> dict[str, Any]:
    import json

    return json.loads(str(target))


# The GPU architectures TVM 0.27 compiles for (NVCC/NVRTC names).
CUDA_ARCHS = (
    "sm_70",
    "sm_72",
    "sm_75",
    "sm_80",
    "sm_86",
    "sm_87",
    "sm_89",
    "sm_90",
    "sm_90a",
    "sm_100",
    "sm_100a",
    "sm_101",
    "sm_103",
    "sm_120",
    "sm_121",
)


def _closest(name: str, known: list[str] | tuple[str, ...]) -> str:
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.0)
    return f"did you mean {match[0]!r}?" if match else ""


def _check_mcpu(config: dict[str, Any]) -> None:
    """LLVM silently falls back to a generic CPU for a name it does not know: refuse it instead."""
    mcpu = config.get("mcpu")
    if not isinstance(mcpu, str):
        return
    codegen = tvm.target.codegen
    triple = config.get("mtriple") or codegen.llvm_get_system_triple()
    if codegen.llvm_is_valid_cpu(mcpu, triple):
        return
    known = list(codegen.llvm_get_cpu_archlist(Target({"kind": "llvm", "mtriple": triple})))
    raise TargetError(
        f"unknown CPU -mcpu={mcpu} for {triple}: {_closest(mcpu, known)} (`llc -mcpu=help` lists them; leave -mcpu "
        "out for this machine's CPU)"
    )


def _check_arch(config: dict[str, Any]) -> None:
    arch = config.get("arch")
    if arch is not None and arch not in CUDA_ARCHS:
        raise TargetError(
            f"unknown GPU architecture -arch={arch}: {_closest(str(arch), CUDA_ARCHS)} (known: {', '.join(CUDA_ARCHS)})"
        )


def _complete_llvm(config: dict[str, Any]) -> dict[str, Any]:
    config = dict(config)
    host = tvm.target.codegen.llvm_get_system_cpu()
    if "mtriple" not in config and config.setdefault("mcpu", host) == host:
        # the host's own name, given or not, means this CPU with the features it offers; a feature the user
        # names in -mattr stays as named
        named = {str(attr).lstrip("+-") for attr in config.get("mattr", [])}
        corrections = [c for c in host_feature_corrections(host) if c[1:] not in named]
        if corrections:
            config["mattr"] = [*config.get("mattr", []), *corrections]
    _check_mcpu(config)
    config.setdefault("num-cores", physical_cores())
    return config


def host_feature_corrections(mcpu: str, flags: set[str] | None = None) -> list[str]:
    """LLVM attributes that make LLVM's CPU ``mcpu`` what this CPU offers (or ``flags``, as /proc/cpuinfo
    names them): ``+amx-bf16`` for a feature the CPU has and the name lacks, ``-amx-bf16`` for one the name
    has and the CPU does not offer; none where the flags cannot be read."""
    named = Target({"kind": "llvm", "mcpu": mcpu})
    return [f"{'+' if offered else '-'}{feature}" for feature, offered in _differences(named, flags)]


def features_not_offered(target: Target, flags: set[str] | None = None) -> list[str]:
    """The vector features kernels for ``target`` may use that this CPU (or ``flags``, as /proc/cpuinfo names
    them) does not offer; none for another architecture's target or where the flags cannot be read."""
    triple = str(target.attrs.get("mtriple", "") or "")
    if target.kind.name != "llvm" or triple not in ("", tvm.target.codegen.llvm_get_system_triple()):
        return []
    return [feature for feature, offered in _differences(target, flags) if not offered]


def _differences(target: Target, flags: set[str] | None) -> list[tuple[str, bool]]:
    """(feature, whether this CPU offers it) for each of ``_HOST_FEATURES`` where ``target`` and this CPU (or
    ``flags``) differ; none where the flags cannot be read."""
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return []
    return [
        (feature, flag in flags)
        for flag, feature in _HOST_FEATURES.items()
        if (flag in flags) != bool(llvm_features.target_has_features(feature, target))
    ]


def _complete_cuda(config: dict[str, Any]) -> dict[str, Any]:
    config = dict(config)
    _check_arch(config)
    runtime_problem()  # loads TVM's CUDA runtime if `import tvm` could not (a CUDA runtime from a wheel)
    device = tvm.cuda(0)
    if device.exist:
        config.setdefault("arch", "sm_" + device.compute_version.replace(".", ""))
        config.setdefault("max_shared_memory_per_block", device.max_shared_memory_per_block)
        config.setdefault("max_threads_per_block", device.max_threads_per_block)
    elif "arch" not in config:
        raise TargetError(
            "target 'cuda' needs an architecture on a machine without a GPU: write e.g. 'cuda -arch=sm_90' (H100) or "
            "'cuda -arch=sm_80' (A100)"
        )
    for key, value in _CUDA_DEFAULT_LIMITS.items():
        config.setdefault(key, value)
    config.setdefault("host", _complete_llvm({"kind": "llvm"}))
    return config


def target_kind(spec: str | dict | Target) -> str | None:
    """The kind a target spec names, without resolving it (None if it names none); ``spec`` may
    also be the JSON form ``str(Target)`` gives, as the database stores targets."""
    if isinstance(spec, Target):
        return spec.kind.name
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        import json

        try:
            spec = json.loads(spec)
        except ValueError:
            return None
    if isinstance(spec, dict):
        return spec.get("kind")
    if isinstance(spec, str) and spec.strip():
        first = spec.split()[0]
        if "/" in first:
            try:
                return Target(first).kind.name
            except (ValueError, RuntimeError):
                return None
        return first
    return None


def require_device(spec: str | dict | Target) -> None:
    """Stop early, in one line, when the target's device cannot be used on this machine: say what
    is missing (a vector feature of the named CPU this one lacks; no GPU, no driver, a driver too old, no
    CUDA 13 runtime) and how to get it."""
    from .errors import NoDeviceError

    kind = target_kind(spec)
    if kind == "llvm":
        target = resolve_target(spec)
        missing = features_not_offered(target)
        if missing:
            raise NoDeviceError(
                f"cannot tune for '{describe_target(target)}' here: its kernels may use {', '.join(missing)}, which "
                f"this CPU does not offer (they would stop with an illegal instruction); leave -mcpu out for this "
                f"CPU, or take them out with -mattr={','.join('-' + f for f in missing)}"
            )
        return
    if kind != "cuda":
        return
    # a typo in -arch is named before the missing GPU (a target's JSON text is for resolve_target to refuse)
    if isinstance(spec, dict):
        _check_arch(spec)
    elif isinstance(spec, str) and not spec.lstrip().startswith("{"):
        _check_arch(_parse_string(spec.strip()))
    problem = runtime_problem()
    if problem is None and tvm.cuda(0).exist:
        return
    raise NoDeviceError(
        f"cannot tune for 'cuda' here: {problem or no_gpu_reason()}; candidates can be built without a GPU but timing "
        "them "
        "needs one, so run on a GPU host (`tuner doctor --target cuda` checks one) or use --target llvm"
    )


def has_bf16_dot_product(target: Target | None) -> bool:
    """Whether kernels for ``target`` may use ``vdpbf16ps`` (its -mcpu has AVX512_BF16)."""
    if target is None or target.kind.name != "llvm":
        return False
    return bool(llvm_features.target_has_features(BF16_FEATURE, target))


def bf16_unit(target: Target | None) -> str | None:
    """The unit bf16 products run on for ``target``: AMX's tiles where its -mcpu (or -mattr) has them
    (``tdpbf16ps``: 16 times the work of a ``vdpbf16ps``), AVX512_BF16, or None (fp32 arithmetic)."""
    if not has_bf16_dot_product(target):
        return None
    return AMX if all(llvm_features.target_has_features(feature, target) for feature in AMX_FEATURES) else AVX512


def cuda_arch_number(target: Target) -> int | None:
    """The compute capability of a CUDA target as a number (90 for sm_90 and sm_90a); None if it names none."""
    match = re.fullmatch(r"sm_(\d+)[a-z]?", str(target.attrs.get("arch", "")))
    return int(match.group(1)) if match else None


def _option_text(value: Any) -> str:
    return ",".join(str(item) for item in value) if isinstance(value, list | tuple) else str(value)


def describe_target(target: Target | str) -> str:
    """A short human-readable form, e.g. ``llvm -mcpu=znver5 -num-cores=2`` or ``cuda -arch=sm_90``."""
    import json

    config = json.loads(str(target)) if not isinstance(target, dict) else target
    shown = {"llvm": ("mcpu", "mattr", "mtriple", "num-cores"), "cuda": ("arch",)}.get(config.get("kind"), ())
    options = " ".join(f"-{k}={_option_text(config[k])}" for k in shown if k in config)
    return f"{config.get('kind')} {options}".strip()
