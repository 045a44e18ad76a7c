"""Running it standalone: the kubeconfig, the server until SIGTERM, the command line."""

import argparse
import asyncio
import logging
import os
import pathlib
import signal
import sys
from collections.abc import Iterable

import kmock
import yaml

from support.kube_emulator.emulator import KubeEmulator


def write_kubeconfig(path: str | os.PathLike[str], url: str, namespace: str = "default") -> None:
    """Write a kubeconfig for kubectl/kubernetes/kopf atomically (readers never see a half)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": str(url).rstrip("/")}}],
        "users": [{"name": "emulator", "user": {"token": "emulator-token"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
    }
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(path)


async def serve(
    port: int, kubeconfig: str, crds: str | None = None, host: str = "127.0.0.1"
) -> None:
    """Run the emulator until SIGTERM/SIGINT; write the kubeconfig & print READY when serving."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with KubeEmulator() as emulator, kmock.Server(emulator, host=host, port=port) as server:
        if crds:
            emulator.load_crds(crds)
        url = str(server.url).rstrip("/")
        write_kubeconfig(kubeconfig, url)
        print(f"READY {url}", flush=True)
        await stop.wait()
        emulator.stop_watches()
        await asyncio.sleep(0.1)  # let the watch handlers finish before aiohttp's shutdown
    print("STOPPED", flush=True)


def main(argv: Iterable[str] | None = None) -> None:
    from support import kube_emulator  # its docstring is the --help text

    parser = argparse.ArgumentParser(
        prog="python -m support.kube_emulator",
        description=kube_emulator.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    parser.add_argument("--crds", help="a directory (or file) with CRD YAMLs to preload")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(None if argv is None else list(argv))
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    asyncio.run(serve(args.port, args.kubeconfig, args.crds, args.host))
