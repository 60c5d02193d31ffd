"""The contenders experiments/vs_frameworks.py times beside the tuned model: OpenVINO (as its users get
it, and forced to fp32), PyTorch under bf16 autocast, and the machine's bf16 dot-product peak;
``tuned / best`` is taken against fp32 runtimes only."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.host import host_has_amx  # noqa: E402
from experiments import frameworks as fw  # noqa: E402
from experiments.machine_limits import MachineLimits, bf16_peak, product_side_by_side  # noqa: E402
from tuner.lowering.bf16.precision import host_has_bf16  # noqa: E402

torch = pytest.importorskip("torch")


class _Scaled(torch.nn.Module):
    """A linear layer over a conv, taking a second input (as a text model takes its mask)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.linear = torch.nn.Linear(8 * 14 * 14, 32)

    def forward(self, x, scale):
        return self.linear(torch.relu(self.conv(x)).flatten(1)) * scale


def _module_and_inputs():
    torch.manual_seed(0)
    return _Scaled().eval(), [torch.randn(1, 3, 16, 16), torch.rand(1, 32) + 0.5]


def _error(contender: fw.Contender, reference) -> float:
    return fw.relative_error(contender.call(), reference)


def test_the_bf16_peak_is_measured_on_the_unit_bf16_products_run_on():
    if not host_has_bf16():
        pytest.skip("this CPU has no avx512_bf16: the bf16 peak is reported absent")
    bf16, why, unit = bf16_peak(threads=1, iterations=200_000)
    assert why == "" and bf16 is not None
    assert unit == ("tdpbf16ps" if host_has_amx() else "vdpbf16ps")
    # not compared with the FMA peak: vdpbf16ps runs at twice it on a Zen 4, at about it on some Zen 5 and below
    # it on a Sapphire Rapids; one core's kernel runs well above 1 GFLOP/s on any of them
    assert 1.0 < bf16 < 1e5


def test_the_bf16_peak_is_described_or_its_absence_explained():
    limits = MachineLimits(2, 500.0, 450.0, None, 20.0, bf16_peak_gflops=None, bf16_absent="no avx512_bf16")
    assert "bf16 dot-product peak absent (no avx512_bf16)" in limits.describe()
    assert limits.as_dict()["bf16_peak_gflops"] is None
    assert "bf16 peak (vdpbf16ps) 1050 GFLOP/s" in MachineLimits(2, 526.0, 450.0, None, 20.0, 1050.0).describe()
    amx = MachineLimits(2, 300.0, 350.0, None, 20.0, 6900.0, bf16_unit="tdpbf16ps")
    assert "bf16 peak (tdpbf16ps) 6900 GFLOP/s" in amx.describe()


def test_our_configured_product_is_timed_beside_torchs_on_its_shape():
    result = product_side_by_side(threads=1, rounds=2, calls=2)
    assert result["shape"] == [128, 768, 768] and result["threads"] == 1
    for side in ("ours", "torch"):  # one core's product runs well above 1 GFLOP/s and below 10 TFLOP/s anywhere
        assert 1.0 < result[side]["median_gflops"] <= result[side]["best_gflops"] < 1e4
    assert 0.05 < result["ours_over_torch"] < 20 and result["fma_peak_gflops"] > 1.0


def test_openvino_forced_to_fp32_matches_pytorch_and_its_default_states_its_precision():
    pytest.importorskip("openvino")
    module, inputs = _module_and_inputs()
    reference = fw.reference_output(fw.torch_eager(module, inputs))
    fp32, default = fw.openvino(module, inputs, threads=2)
    assert (fp32.name, default.name) == (fw.OPENVINO_FP32, fw.OPENVINO_DEFAULT)
    assert not fp32.missing and not default.missing, (fp32.missing, default.missing)
    assert fp32.precision == "fp32" and _error(fp32, reference) < 1e-4
    assert default.precision in {"fp32", "bf16", "fp16"}
    assert _error(default, reference) < (5e-2 if default.precision != "fp32" else 1e-4)


def test_openvino_reports_why_a_model_does_not_convert():
    pytest.importorskip("openvino")

    class Unconvertible(torch.nn.Module):
        def forward(self, x):
            raise ValueError("no forward here")

    contenders = fw.openvino(Unconvertible(), [torch.randn(2, 2)], threads=1)
    assert [c.call for c in contenders] == [None, None]
    assert all("no forward here" in c.missing for c in contenders)


def test_pytorch_under_bf16_autocast_computes_in_bf16_near_fp32():
    module, inputs = _module_and_inputs()
    reference = fw.reference_output(fw.torch_eager(module, inputs))
    autocast = fw.torch_autocast(module, inputs, "bfloat16")
    assert autocast.name == fw.autocast_name("bfloat16") and autocast.precision == "bf16", autocast.missing
    assert 0 < _error(autocast, reference) < 5e-2  # bf16's 8-bit mantissa, read back as fp32


def test_tuned_over_best_is_against_fp32_runtimes_and_bf16_ones_get_their_own_ratio():
    from experiments.vs_frameworks import Setting
    from experiments.vs_frameworks_tables import model_row

    lineup = Setting(dtype="bfloat16").lineup()
    assert lineup.precision == "fp32" and lineup.reduced == "bf16"
    latency = {"tuned": 1.0, "PyTorch eager": 4.0, "ONNX Runtime": 3.0, fw.OPENVINO_FP32: 2.0}
    latency |= {fw.OPENVINO_DEFAULT: 0.5, fw.autocast_name("bfloat16"): 0.8}
    precision = {name: "fp32" for name in latency} | {fw.OPENVINO_DEFAULT: "bf16", fw.autocast_name("bfloat16"): "bf16"}
    timed = {"latency": latency, "precision": precision, "errors": {"tuned": 1e-3}, "output_scale": 4.0}
    tuned = {"tasks": [{"launches": 1, "flops": 1e9, "bytes": 1e6, "latency": 1e-3}], "trials": 1, "tuning_seconds": 1}
    row = model_row("m", tuned, timed, MachineLimits(2, 500.0, 450.0, None, 20.0), lineup)
    assert row["best fp32"] == fw.OPENVINO_FP32 and row["tuned / best"] == "0.50"
    assert row["tuned / best bf16"] == "2.00" and row[f"{fw.OPENVINO_DEFAULT} in"] == "bf16"
    assert list(row).index("OpenVINO (default) error") < list(row).index("of outputs up to")
    assert fw.OPENVINO_FP32 not in Setting(target="cuda").lineup().frameworks  # a CPU runtime
