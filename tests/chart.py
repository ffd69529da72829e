"""charts/coschedule rendered and linted by a real Helm (v4, as a library: PyPI
``helm-python-sdk``), for the chart tests and the e2e dry run."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "coschedule"
RELEASE = "coschedule"
NAMESPACE = "coschedule-system"
# A values file that sets every option the chart has (tests/test_chart.py checks it does).
ALL_OPTIONS = ROOT / "tests" / "fixtures" / "chart-all-options.yaml"

Obj = dict[str, Any]


def helm() -> Any:
    """The ``helm_python`` module, or skip: its wheels exist for linux x86_64 (pyproject)."""
    return pytest.importorskip(
        "helm_python", reason="helm-python-sdk (dev dependency, linux x86_64) is not installed"
    )


@functools.cache
def _render_text(values_yaml: str, namespace: str) -> str:
    values = yaml.safe_load(values_yaml) if values_yaml else None
    with helm().Chart.load(str(CHART)) as chart:
        rendered: dict[str, str] = chart.render(
            values, name=RELEASE, namespace=namespace, is_install=True
        )
        crds = [crd["data"] for crd in chart.crds]
    # Like `helm template --include-crds`: the crds/ folder first, then the templates.
    manifests = [text for name, text in sorted(rendered.items()) if name.endswith(".yaml")]
    return "\n---\n".join([*crds, *manifests])


def render_chart(values: Obj | None = None, namespace: str = NAMESPACE) -> list[Obj]:
    """Every object the chart renders (CRDs included), fresh copies."""
    text = _render_text(yaml.safe_dump(values) if values else "", namespace)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render_chart_text(values: Obj | None = None, namespace: str = NAMESPACE) -> str:
    return _render_text(yaml.safe_dump(values) if values else "", namespace)


def all_options() -> Obj:
    values: Obj = yaml.safe_load(ALL_OPTIONS.read_text("utf-8"))
    return values


def lint(values: Obj | None = None, kube_version: str = "v1.30.0") -> Obj:
    report: Obj = helm().lint(
        str(CHART), values, strict=True, namespace=NAMESPACE, kube_version=kube_version
    )
    return report
