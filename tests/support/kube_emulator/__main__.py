"""``python -m support.kube_emulator --port 0 --kubeconfig PATH [--crds DIR]``: serve standalone."""

from support.kube_emulator.runner import main

if __name__ == "__main__":
    main()
