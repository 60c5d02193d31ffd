"""Turning candidates into numbers: parallel builds, isolated timing, fault recovery.

Attributes are loaded lazily: a measuring worker started with the TVM runtime alone imports this
package and must not pull in the compiler.
"""

from common.lazy_exports import lazy_exports

_EXPORTS = {
    "AdaptiveTimeout": ".timeouts",
    "BuildResult": ".types",
    "DeviceUnavailable": ".engine.engine",
    "Engine": ".contract",
    "EngineConfig": ".contract",
    "MeasureEngine": ".engine.engine",
    "MeasureInput": ".types",
    "MeasureResult": ".types",
    "Status": ".types",
    "TimeoutPolicy": ".timeouts",
    "TimingConfig": ".timing.sampling",
    "VerifyResult": ".types",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
