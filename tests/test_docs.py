"""What the README and docs/ claim that can be checked mechanically: every link and anchor
leads somewhere, every metric, Event reason, alert, config key and command flag they name is
one the code (or the shipped PrometheusRule) has, and the troubleshooting page names every
Event reason the reconciler records."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
import yaml

from tests.test_docs_metrics import registered

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RULES = ROOT / "manifests" / "components" / "monitoring" / "prometheusrule.yaml"


def _text(path: Path) -> str:
    return path.read_text("utf-8")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a `# comment` there is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(_text(path)).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_slug_is_githubs() -> None:
    assert slug("Volume co-location (`pipelineruns`, `isolate-pipelinerun`)") == (
        "volume-co-location-pipelineruns-isolate-pipelinerun"
    )
    assert slug("Hardening policy: `policy-*`") == "hardening-policy-policy-"
    assert slug("A run's pods are not co-located") == "a-runs-pods-are-not-co-located"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_leads_somewhere(page: Path) -> None:
    broken: list[str] = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(_text(page))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert broken == [], page.name


def test_the_docs_index_lists_every_page() -> None:
    index = _text(ROOT / "docs" / "index.md")
    for page in PAGES[1:]:
        if page.name != "index.md":
            assert f"]({page.name})" in index, page.name


def test_every_metric_the_docs_name_is_registered() -> None:
    code = set(registered())
    named: dict[str, str] = {}
    for page in PAGES:
        for name in re.findall(r"\bcoschedule_[a-z_]*[a-z]", _text(page)):
            named.setdefault(re.sub(r"_(bucket|sum|count)$", "", name), page.name)
    assert len(named) >= 20
    assert {n: p for n, p in named.items() if n not in code} == {}


def _alerts() -> set[str]:
    rules = yaml.safe_load(_text(RULES))
    return {r["alert"] for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r}


def _module_strings() -> dict[str, set[str]]:
    """NAME -> the string values module-level constants of that name have in coschedule/."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "coschedule").rglob("*.py"):
        for node in ast.parse(_text(path)).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, set()).add(node.value.value)
    return found


# The calls that record an Event, and which positional argument is its reason.
_REASON_ARG = {"RecordEvent": 2, "record_event": 3, "run_event": 2, "_run_events": 1}
_REASON_ARG["UnmarkedPlan"] = 1  # the unmarked-pod controller records the plan's reason


@functools.cache
def event_reasons() -> frozenset[str]:
    """Every Event reason the code records, read from the calls that record one."""
    constants = _module_strings()
    reasons: set[str] = set()
    for path in (ROOT / "coschedule").rglob("*.py"):
        tree = ast.parse(_text(path))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            local = {
                t.id: n.value.value
                for n in ast.walk(func)
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                for t in n.targets
                if isinstance(t, ast.Name) and isinstance(n.value.value, str)
            }
            for call in ast.walk(func):
                if not isinstance(call, ast.Call):
                    continue
                name = getattr(call.func, "id", getattr(call.func, "attr", ""))
                index = _REASON_ARG.get(name)
                if index is None or len(call.args) <= index:
                    continue
                arg = call.args[index]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    reasons.add(arg.value)
                elif isinstance(arg, ast.Name) and arg.id in local:
                    reasons.add(local[arg.id])
                elif isinstance(arg, ast.Name):
                    reasons |= constants.get(arg.id, set())
    return frozenset(r for r in reasons if re.fullmatch(r"[A-Z][A-Za-z]+", r))


def test_troubleshooting_names_every_event_reason_the_code_records() -> None:
    reasons = event_reasons()
    assert {"RunStuck", "PlaceholderRelocated", "PodRecreated", "Started"} <= reasons
    assert len(reasons) >= 15, sorted(reasons)
    page = _text(ROOT / "docs" / "troubleshooting.md")
    assert sorted(r for r in reasons if f"`{r}`" not in page) == []


def test_every_event_reason_and_alert_the_docs_name_exists() -> None:
    """A `CamelCase` word next to "Event" in the docs is a reason the code records; one that
    starts with Coschedule is an alert of the shipped PrometheusRule."""
    reasons, alerts = event_reasons(), _alerts()
    assert len(alerts) >= 10
    unknown: list[str] = []
    for page in PAGES:
        text = " ".join(_prose(_text(page)).split())
        for name in re.findall(r"`(Coschedule[A-Z]\w+)`", text):
            if name not in alerts:
                unknown.append(f"{page.name}: alert {name}")
        for pattern in (r"Events? `([A-Z]\w+)`", r"`([A-Z]\w+)` (?:Warning )?Events?\b"):
            for name in re.findall(pattern, text):
                if name not in reasons:
                    unknown.append(f"{page.name}: Event {name}")
    assert unknown == []
    troubleshooting = _text(ROOT / "docs" / "troubleshooting.md")
    assert sorted(a for a in alerts if f"`{a}`" not in troubleshooting) == []


def test_the_config_key_tables_name_known_keys() -> None:
    from coschedule.config.settings import KNOWN_KEYS

    for page in (ROOT / "README.md", ROOT / "docs" / "configuration.md"):
        tables = re.findall(r"^\| key \| default \|.*?(?:\n\n|\Z)", _text(page), re.M | re.S)
        keys = re.findall(r"^\| `([a-z-]+)` \|", "".join(tables), re.M)
        assert len(keys) >= 7, page.name
        assert sorted(set(keys) - KNOWN_KEYS) == [], page.name
    # docs/configuration.md covers every key: in its table or as a section of its own.
    text = _text(ROOT / "docs" / "configuration.md")
    assert sorted(k for k in KNOWN_KEYS if f"`{k}`" not in text) == []


def test_the_reference_names_every_flag_of_every_command() -> None:
    from coschedule.cli.main import build_parser

    text = _text(ROOT / "docs" / "reference.md")
    block = text.split("## Commands", 1)[1].split("```", 2)[1]
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    missing: list[str] = []
    for command, sub_parser in sub.choices.items():
        for action in sub_parser._actions:
            flags = [f for f in action.option_strings if f not in ("-h", "--help")]
            # A flag is shown by any of its spellings (-c for --claims), --[no-]X for a pair.
            spellings = [*flags, *(f.replace("--", "--[no-]", 1) for f in flags)]
            if flags and not any(
                re.search(rf"(?<![\w\-\]]){re.escape(s)}(?![\w-])", block) for s in spellings
            ):
                missing.append(f"{command} {flags[-1]}")
    assert missing == []
