"""MFU against the precision each op class really runs in: cuDNN convolutions in TF32 by default, cuBLAS matrix
products in IEEE float32 unless asked, TF32 only on compute capability 8.0 and later, torch's ``fp32_precision``
API, one die of an MI250X or MI250 under ROCm's "AMD Radeon Graphics", and no MFU above 1 without a word.

The device is faked (compute capability, ROCm properties); torch's precision flags are the real ones, restored after
each test. The FLOP counts come from torch's real ``FlopCounterMode`` on the CPU, the step times from a real trace.
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fitprof import analyze  # noqa: E402
from fitprof.profilers.flops_torch import (  # noqa: E402
    TorchFlopCount,
    compute_dtype,
    conv_compute_dtype,
    device_name,
)
from fitprof.throughput import PEAK_FLOPS, StepWork, device_key, peak_flops_per_s, with_throughput  # noqa: E402

TRACE = Path(__file__).parent / "data" / "lightning_cpu.pt.trace.json.gz"
CUDA = torch.device("cuda")


@pytest.fixture
def precision_flags() -> Iterator[None]:
    """Put torch's float32 precision settings back as they were (through the new API, which never raises)."""
    paths = (("cuda", "matmul"), ("cudnn", "conv"), ("cudnn",), ())
    saved = []
    for path in paths:
        node = torch.backends
        for part in path:
            node = getattr(node, part)
        saved.append((node, node.fp32_precision))
    yield
    for node, value in saved:
        node.fp32_precision = value


def _capability(monkeypatch: pytest.MonkeyPatch, major: int, minor: int = 0) -> None:
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))


def test_float32_convolutions_run_in_tf32_by_default_matrix_products_do_not(
    precision_flags: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _capability(monkeypatch, 9)  # H200
    assert torch.backends.cudnn.allow_tf32 is True  # torch's default: cuDNN may use TF32
    assert compute_dtype("float32", CUDA) == "float32"
    assert conv_compute_dtype("float32", CUDA) == "tf32"
    torch.set_float32_matmul_precision("high")
    assert compute_dtype("float32", CUDA) == "tf32"
    torch.backends.cudnn.allow_tf32 = False
    assert conv_compute_dtype("float32", CUDA) == "float32"
    # Other dtypes are what they are; a CPU has no TF32.
    assert compute_dtype("bfloat16", CUDA) == conv_compute_dtype("bfloat16", CUDA) == "bfloat16"
    assert conv_compute_dtype("float32", torch.device("cpu")) == "float32"


def test_the_fp32_precision_api_is_read_and_does_not_raise(
    precision_flags: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _capability(monkeypatch, 8)
    # In a fresh process the legacy getter (torch.get_float32_matmul_precision) raises after this line.
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    assert compute_dtype("float32", CUDA) == "tf32"
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    assert compute_dtype("float32", CUDA) == conv_compute_dtype("float32", CUDA) == "float32"
    # "none" asks the parent: cuDNN's, then torch's generic setting.
    torch.backends.cudnn.conv.fp32_precision = "none"
    torch.backends.cudnn.fp32_precision = "none"
    torch.backends.fp32_precision = "tf32"
    assert conv_compute_dtype("float32", CUDA) == "tf32"


@pytest.mark.parametrize(("major", "minor"), [(7, 0), (7, 5)])  # V100, T4
def test_no_tf32_before_compute_capability_8(
    precision_flags: None, monkeypatch: pytest.MonkeyPatch, major: int, minor: int
) -> None:
    _capability(monkeypatch, major, minor)
    torch.set_float32_matmul_precision("high")
    assert compute_dtype("float32", CUDA) == conv_compute_dtype("float32", CUDA) == "float32"
    name = "Tesla V100-SXM2-16GB" if major == 7 and minor == 0 else "Tesla T4"
    assert math.isfinite(peak_flops_per_s(name, compute_dtype("float32", CUDA))[0])


def test_rocm_dies_are_named_by_architecture_and_compute_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "AMD Radeon Graphics")
    for cus, key, fp32 in ((104, "mi250", 90.5e12 / 2), (110, "mi250x", 95.7e12 / 2)):
        props = types.SimpleNamespace(gcnArchName="gfx90a:sramecc+:xnack-", multi_processor_count=cus)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None, p=props: p)
        name = device_name(CUDA)
        assert name == f"AMD Radeon Graphics (gfx90a, {cus} CUs)"
        assert device_key(name) == key
        # One die: half the module's datasheet figure.
        assert peak_flops_per_s(name, "float32") == (pytest.approx(fp32), "")
        assert compute_dtype("float32", CUDA) == conv_compute_dtype("float32", CUDA) == "float32"  # no TF32 on ROCm
    assert device_key("AMD Radeon Graphics") is None  # without the architecture nothing says which part


def test_kineto_fixture_names_its_mi250_die(kineto_fixtures: Path) -> None:
    """The real ROCm trace's device: "AMD Radeon Graphics", 104 compute units, 64 GB: a die of an MI250."""
    import gzip
    import json

    with gzip.open(kineto_fixtures / "mi250_rocm_minitoy_train.json.gz", "rt") as f:
        props = json.load(f)["deviceProperties"][0]
    assert props["name"] == "AMD Radeon Graphics"
    assert device_key(f"{props['name']} (gfx90a, {props['numSms']} CUs)") == "mi250"


def test_convolutions_are_counted_apart() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
    counter = TorchFlopCount()
    counter.start()
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    total = counter.stop()
    # Forward: 2 * outputs (2*4*6*6) * kh*kw*Cin (3*3*3); backward: the weight gradient only (the input needs none).
    conv = 2 * (2 * 4 * 6 * 6) * (3 * 3 * 3) * 2
    linear = 2 * 2 * 144 * 5 * 3  # forward, grad-weight, grad-input
    assert counter.conv_flops == conv
    assert total == conv + linear


def test_mfu_holds_each_op_class_against_its_own_peak() -> None:
    report = analyze(TRACE)
    step_s = report.step_time_ms / 1000
    h200 = PEAK_FLOPS["h200-sxm"].flops_per_s
    conv, mm = 30e12 * step_s, 10e12 * step_s  # 30 TFLOP/s of convolutions, 10 of matrix products
    work = StepWork(
        flops_per_step=conv + mm,
        conv_flops_per_step=conv,
        device_name="NVIDIA H200",
        dtype="float32",
        conv_dtype="tf32",
    )
    out = with_throughput(report, work)
    assert out.mfu == pytest.approx((conv / h200["tf32"] + mm / h200["float32"]) / step_s, rel=1e-9)
    assert out.flops_per_s / out.peak_flops_per_s == pytest.approx(out.mfu, rel=1e-12)
    assert out.compute_dtype == "float32 matmul, tf32 conv"
    assert "float32 matmul, tf32 conv" in out.summary_markdown()
    # Held against the float32 peak alone the same step would read 40/67: the convolutions' TF32 made it 0.16.
    assert out.mfu < 0.25


def test_mfu_above_one_is_never_reported_silently() -> None:
    report = analyze(TRACE)
    step_s = report.step_time_ms / 1000
    work = StepWork(flops_per_step=200e12 * step_s, device_name="NVIDIA H200", dtype="float32")  # 3x fp32 peak
    out = with_throughput(report, work)
    assert math.isnan(out.mfu) and math.isnan(out.scalars()["fitprof/mfu"])
    assert "2.99x the dense float32 peak of NVIDIA H200" in out.mfu_note
    assert out.mfu_note in out.summary_markdown()
    assert out.flops_per_s == pytest.approx(200e12, rel=1e-9)  # the rate itself is kept


def test_tensorflow_tf32_needs_compute_capability_8(monkeypatch: pytest.MonkeyPatch) -> None:
    tf = pytest.importorskip("tensorflow")
    from fitprof.profilers.flops_tf import device_and_dtype

    model = types.SimpleNamespace(dtype_policy=types.SimpleNamespace(compute_dtype="float32"))
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"])
    assert tf.config.experimental.tensor_float_32_execution_enabled()  # TensorFlow's default
    for name, capability, dtype in (
        ("Tesla V100-SXM2-16GB", (7, 0), "float32"),
        ("NVIDIA A100-SXM4-80GB", (8, 0), "tf32"),
        ("AMD Instinct MI250X/MI250", None, "float32"),  # ROCm: no compute capability, no TF32
    ):
        details = (
            {"device_name": name} if capability is None else {"device_name": name, "compute_capability": capability}
        )
        monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda device, d=details: d)
        assert device_and_dtype(model) == (name, dtype)
        assert math.isfinite(peak_flops_per_s(name, dtype)[0])


@pytest.mark.gpu
def test_on_the_device_a_float32_conv_step_reads_an_mfu_in_0_1(precision_flags: None) -> None:
    """A float32 conv net on the real device: its convolutions run in the precision fitprof assumes (TF32 on
    compute capability 8.0+ unless cuDNN's TF32 is off) and its MFU, from a CUDA-event step time, is in (0, 1]."""
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(64, 256, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(256, 256, 3, padding=1)
    ).to(device)
    x = torch.randn(64, 64, 56, 56, device=device)
    counter = TorchFlopCount()
    counter.start()
    model(x).sum().backward()
    flops = counter.stop()
    assert counter.conv_flops == flops > 0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        model(x).sum().backward()
    start.record()
    for _ in range(10):
        model(x).sum().backward()
    end.record()
    torch.cuda.synchronize()
    step_s = start.elapsed_time(end) / 1000 / 10
    name = device_name(device)
    dtype, conv_dtype = compute_dtype("float32", device), conv_compute_dtype("float32", device)
    if torch.cuda.get_device_capability(device)[0] >= 8:
        assert conv_dtype == "tf32"
    peak, why = peak_flops_per_s(name, conv_dtype)
    if math.isnan(peak):
        pytest.skip(why)
    mfu = flops / step_s / peak
    assert 0 < mfu <= 1, (name, dtype, conv_dtype, flops / step_s)
