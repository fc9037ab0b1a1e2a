"""bench/proxy_throughput.py's plot, from a result of the shape the script writes."""
from __future__ import annotations

from pathlib import Path

import pytest

from .bench_scripts import load_bench

proxy_bench = load_bench("proxy_throughput.py", "bench_proxy_throughput")


def _side(up: list[float], down: list[float], p50: float, p99: float) -> dict:
    import statistics
    return {"upload_mb_s": up, "download_mb_s": down, "upload_median_mb_s": statistics.median(up),
            "download_median_mb_s": statistics.median(down), "ping_median_us": p50, "ping_p99_us": p99}


def test_the_plot_shows_every_repetition_and_the_pings(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = {"payload_bytes": 64 << 20, "repetitions": 3, "pings": 100,
              "direct": _side([3000, 3100, 2900], [3200, 3300, 3100], 75, 118),
              "proxy": _side([1600, 1500, 1700], [1500, 1550, 1450], 135, 275),
              "ratio_upload": 0.52, "ratio_download": 0.47}
    png = tmp_path / "out" / "proxy.png"
    proxy_bench.plot(result, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
