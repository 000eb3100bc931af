"""Does torch's AOTInductor work on this machine at all? One linear layer exported, compiled to a package,
loaded and run, on the CPU and (when there is one) on the GPU, side by side, each in a process of its own,
since a broken build crashes the loading process outright. Exits 1 when any device fails, so a GPU session
skips the ahead-of-time benchmarks instead of spending minutes on a crash that is not the package's.

    python bench/aot_probe.py
"""

from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
import tempfile

import torch

LIMIT_S = 80


def probe(device: str) -> None:
    """Compile, load and run the layer on `device`, saying each stage as it is reached."""
    faulthandler.enable()
    layer = torch.nn.Linear(8, 4).to(device)
    example = torch.randn(2, 8, device=device)
    program = torch.export.export(layer, (example,))
    with tempfile.TemporaryDirectory() as folder:
        package = os.path.join(folder, "probe.pt2")
        path = torch._inductor.aoti_compile_and_package(program, package_path=package)
        print(f"{device}: compiled", flush=True)
        loaded = torch._inductor.aoti_load_package(path)
        print(f"{device}: loaded", flush=True)
        difference = float((loaded(example) - layer(example)).abs().max())
    print(f"{device}: runs, largest difference from eager {difference:.2g}", flush=True)


def main() -> int:
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"AOTInductor probe, torch {torch.__version__}", flush=True)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    running = {device: subprocess.Popen([sys.executable, __file__, device], **pipes) for device in devices}
    failed = []
    for device, process in running.items():
        try:
            output, _ = process.communicate(timeout=LIMIT_S)
            code = process.returncode
        except subprocess.TimeoutExpired:
            process.kill()
            output, code = process.communicate()[0], None
        stages = [line for line in output.splitlines() if line.startswith(f"{device}:")]
        last = stages[-1] if stages else f"{device}: nothing reached"
        if code != 0:
            failed.append(device)
            ending = f"no answer in {LIMIT_S} s" if code is None else f"exit {code}"
            ending = f"killed by signal {-code}" if code is not None and code < 0 else ending
            print(f"  {device}: FAILED ({ending}) after '{last}'", flush=True)
        else:
            print(f"  {last}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 2:
        probe(sys.argv[1])
    else:
        sys.exit(main())
