"""``python -m support.realkube [--dir DIR] [--restart-job]`` (``make cluster``): start a real
control plane with JobSet and Kueue, print its admin kubeconfig's path, run until interrupted
(Ctrl-C or SIGTERM), then stop every process."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from . import running_plane


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m support.realkube")
    parser.add_argument("--dir", type=Path, help="where state and logs go (default: a temp dir)")
    parser.add_argument(
        "--restart-job", action="store_true", help="JobSet with its alpha RestartJob gate on"
    )
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="shardmeter-kube-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    started = time.monotonic()
    gates = {"RestartJob": True} if args.restart_job else {}
    with running_plane(directory, jobset_feature_gates=gates) as plane:
        kubeconfig = plane.control.admin_kubeconfig
        print(f"Started in {time.monotonic() - started:.1f} s: {plane.control.url}", flush=True)
        print(f"export KUBECONFIG={kubeconfig}", flush=True)
        print(f"logs: {plane.control.directory / 'logs'}   (Ctrl-C stops it)", flush=True)
        try:
            while True:
                plane.check_running()
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
