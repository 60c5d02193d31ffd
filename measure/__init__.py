"""Turning candidates into numbers: parallel builds, isolated timing, fault recovery.

Attributes are loaded lazily: a measuring worker started with the TVM runtime alone imports this
package and must not pull in the compiler.
"""

from importlib import import_module

_EXPORTS = {
    "DeviceUnavailable": "engine",
    "Engine": "contract",
    "EngineConfig": "contract",
    "MeasureEngine": "engine",
    "BuildResult": "types",
    "MeasureInput": "types",
    "MeasureResult": "types",
    "Status": "types",
    "VerifyResult": "types",
    "TimingConfig": "timing",
    "AdaptiveTimeout": "timeouts",
    "TimeoutPolicy": "timeouts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
