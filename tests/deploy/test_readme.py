"""The cluster quickstarts are short and their ``helm install`` lines set values the chart
has. Running them as written — the chart installed, every ``kubectl`` line, the launch — is
tests/kube/test_readme.py's, against a real control plane."""

from __future__ import annotations

import shlex

from support.quickstart import README, REPO, helm_values, install_steps, quickstart


def test_the_quickstart_is_short_and_installs_the_chart() -> None:
    commands = quickstart()
    assert len(commands) <= 10
    (helm,) = [c for c in commands if c[0] == "helm"]
    assert helm[2] == "shardmeter" and (REPO / helm[3]).is_dir()
    helm_values(helm)
    assert len(README.read_text().splitlines()) <= 250


def test_the_install_guides_helm_line_sets_chart_values() -> None:
    (helm,) = [c for c in install_steps() if c.startswith("helm ")]
    release, values = helm_values(shlex.split(helm.replace("$REGISTRY", "registry.example.com")))
    assert release == "shardmeter" and values["benchImage"]["repository"]
