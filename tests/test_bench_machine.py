"""The benchmark names the machine's case (issue: fast on every CPU): the CPU's units as the CPU reports them, the
kernels torch picked, whether bf16 products can help, the threads, and a warning when the machine is shared."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from machina import bench
from machina.speed import machine

AMX_XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile
"""
ZEN4_EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse sse2 avx avx2 avx512f avx512bw avx512_bf16
"""
AVX2_EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx avx2 fma bmi2
"""


def write(tmp_path, text):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return str(path)


def test_an_amx_cpu_is_named_with_its_bf16_units(tmp_path, monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    described = machine.describe(write(tmp_path, AMX_XEON))
    assert described["cpu"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert described["units"] == ["amx_bf16", "avx512_bf16", "avx512f", "avx2"]
    assert described["bf16_products"] is True
    line = machine.summary(described)
    assert "Platinum 8480+" in line and "amx_bf16 avx512_bf16 avx512f avx2" in line and "on bf16 units" in line


def test_an_avx2_only_cpu_is_told_that_bf16_products_do_nothing(tmp_path):
    described = machine.describe(write(tmp_path, AVX2_EPYC))
    assert described["units"] == ["avx2"] and described["bf16_products"] is False
    assert "no speed-up here" in machine.summary(described)


def test_avx512_bf16_without_amx_is_told_that_bf16_products_do_nothing(tmp_path, monkeypatch):
    # A Zen 4 EPYC reports avx512_bf16 but no AMX; torch computes the flag's float32 products exactly there.
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    described = machine.describe(write(tmp_path, ZEN4_EPYC))
    assert described["units"] == ["avx512_bf16", "avx512f", "avx2"] and described["bf16_products"] is False
    assert "no speed-up here" in machine.summary(described)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_bf16")  # oneDNN below AMX on a CPU that has it
    assert machine.describe(write(tmp_path, AMX_XEON))["bf16_products"] is False


def test_onednn_limited_to_avx2_counts_as_no_bf16_units(tmp_path, monkeypatch):
    # The AVX2-only emulation on a CPU that has the units (BENCHMARKS.md): oneDNN is kept below its bf16 kernels.
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert machine.describe(write(tmp_path, AMX_XEON))["bf16_products"] is False
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_amx")
    assert machine.describe(write(tmp_path, AMX_XEON))["bf16_products"] is True


def test_a_missing_cpuinfo_still_describes_the_machine(tmp_path):
    described = machine.describe(str(tmp_path / "absent"))
    assert described["units"] == [] and described["bf16_products"] is False and described["cpu"]
    assert described["cores"] >= 1 and described["threads"] == torch.get_num_threads()


def test_the_kernels_follow_aten_cpu_capability_in_a_new_process():
    # ATEN_CPU_CAPABILITY is read when torch loads, so only a fresh process shows it.
    code = "from machina.speed import machine; print(machine.describe()['kernels'])"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "DEFAULT"


def test_a_busy_machine_is_warned_about_and_a_quiet_one_is_not():
    quiet = {"busy": machine.SHARED_BUSY - 0.01, "load": 3.0}  # a high load average alone: a benchmark just ended
    busy = {"busy": 1.3, "load": 0.0}
    assert machine.shared_warning(quiet) is None
    warning = machine.shared_warning(busy)
    assert warning.startswith("warning:") and "1.30 cores" in warning and "--compare" in warning


def write_stat(path, per_cpu):
    # /proc/stat's layout: the aggregate line, then one per CPU (user nice system idle iowait irq softirq steal ...).
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{i} {user} 0 0 {idle} {iowait} 0 0 0 0 0" for i, (user, idle, iowait) in enumerate(per_cpu)]
    path.write_text("\n".join(lines + ["intr 0", "ctxt 0"]) + "\n")


def test_busy_cores_are_the_non_idle_share_of_the_jiffies_times_the_cpus(tmp_path):
    stat = tmp_path / "stat"
    write_stat(stat, [(100, 400, 0), (0, 500, 0), (0, 500, 0)])
    before = machine.cpu_times(str(stat), {0, 1})
    assert before == (900, 1000, 2)
    # 100 jiffies per CPU: CPU 0 busy 75 (and idle 15, waiting on I/O 10), CPU 1 idle; CPU 2, not ours, busy.
    write_stat(stat, [(175, 415, 10), (0, 600, 0), (100, 500, 0)])
    after = machine.cpu_times(str(stat), {0, 1})
    assert machine.busy_between(before, after) == pytest.approx(75 / 200 * 2)
    everyone = machine.busy_between(machine.cpu_times(str(stat)), machine.cpu_times(str(stat)))
    assert everyone == 0.0  # no time passed: nothing measured
    assert machine.cpu_times(str(tmp_path / "missing")) is None
    assert machine.busy_cores(0.0, str(tmp_path / "missing")) == 0.0
    stat.write_text("cpu  1 2 3 4 5 6 7 8\n\ncpu0 1 2 3 4 5 6 7 8\nintr 5\n")  # a blank line is skipped
    assert machine.cpu_times(str(stat)) == (9, 36, 1)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="busy cores are read from Linux's /proc/stat")
def test_a_process_spinning_beside_the_benchmark_is_counted_as_a_busy_core():
    spinner = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"
    spin = subprocess.Popen([sys.executable, "-c", spinner])
    try:
        time.sleep(0.3)  # the interpreter started and spinning
        busy = machine.busy_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert busy >= 0.8  # one whole core, less what the scheduler gives others
    assert machine.shared_warning({"busy": busy}) is not None


def test_the_bench_prints_the_case_first_and_stores_it_with_each_result(capsys):
    threads = torch.get_num_threads()
    try:
        results = bench.main(["--epochs", "1", "--steps", "4", "--json", "debug=tiny", "system.threads=1"])
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0].startswith("machine: ")
    printed = [json.loads(line) for line in captured.out.splitlines() if line.startswith("{")]
    assert len(printed) == len(results) == 1
    case = printed[0]["machine"]
    assert case["threads"] == 1  # as the run's system.threads left them, not the process's default
    assert set(case) == {"cpu", "units", "kernels", "bf16_products", "threads", "cores", "load", "busy"}
    assert set(case["units"]) <= set(machine.UNITS)
