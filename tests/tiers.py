"""What the two tiers beyond the unit tests (tests/e2e, tests/real) do alike in their
conftests: where the tier cannot run, its scenarios are not collected and one stand-in item
is, which skips with the reason (one line in the summary, whatever the number of scenarios)
or, where the tier was asked for (``required_env`` set: ``make e2e``, ``make e2e-real``, CI),
fails with it; every item of the tier's folder gets its marker; a failed scenario's report
carries the tails of the components' logs; the tier's notes end the terminal summary.

A conftest binds the hooks ``tier_hooks`` returns to pytest's hook names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest


@dataclass(frozen=True)
class Tier:
    marker: str  # "e2e", "real"
    what: str  # "the e2e suite": in the failure's sentence
    item: str  # the stand-in item's name
    conftest: Path
    required_env: str
    logs_title: str
    # Why the tier cannot run here (None: it can), asked at collection.
    unavailable: Callable[[pytest.Config], str | None]
    # The running session's component logs (None: no session).
    logs: Callable[[], str | None]
    notes: list[str]
    fix: str = ""  # what to do, added to the failure

    @property
    def folder(self) -> Path:
        return self.conftest.parent


class _Unavailable(pytest.Item):
    def __init__(self, *, tier: Tier, reason: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tier = tier
        self.reason = reason

    def runtest(self) -> None:
        tier = self.tier
        if os.environ.get(tier.required_env):
            pytest.fail(
                f"{self.reason} ({tier.required_env} is set: {tier.what} was asked for and "
                f"cannot run{tier.fix})",
                pytrace=False,
            )
        pytest.skip(self.reason)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.tier.what.removeprefix("the ")


class _UnavailableTier(pytest.File):
    tier: Tier
    reason: str

    def collect(self) -> Iterator[pytest.Item]:
        item = _Unavailable.from_parent(
            self, name=self.tier.item, tier=self.tier, reason=self.reason
        )
        item.add_marker(getattr(pytest.mark, self.tier.marker))
        yield item


class Hooks(NamedTuple):
    ignore_collect: Callable[[Path, pytest.Config], bool | None]
    collect_file: Callable[[Path, pytest.Collector], pytest.Collector | None]
    collection_modifyitems: Callable[[pytest.Config, list[pytest.Item]], None]
    runtest_makereport: Callable[..., Generator[None, Any, None]]
    terminal_summary: Callable[[Any], None]


def tier_hooks(tier: Tier) -> Hooks:
    def ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
        if collection_path.parent == tier.folder and tier.unavailable(config) is not None:
            return collection_path.name.startswith("test_") or None
        return None

    def collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        if file_path == tier.conftest:
            reason = tier.unavailable(parent.config)
            if reason is not None:
                stand_in = _UnavailableTier.from_parent(parent, path=file_path)
                stand_in.tier = tier
                stand_in.reason = reason
                return stand_in
        return None

    def collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
        for item in items:
            if tier.folder in Path(str(item.path)).parents:
                item.add_marker(getattr(pytest.mark, tier.marker))

    @pytest.hookimpl(hookwrapper=True)
    def runtest_makereport(
        item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        report = outcome.get_result()
        if report.failed and tier.folder in Path(str(item.path)).parents:
            logs = tier.logs()
            if logs is not None:
                report.sections.append((tier.logs_title, logs))

    def terminal_summary(terminalreporter: Any) -> None:
        for note in tier.notes:
            terminalreporter.write_line(f"{tier.marker}: {note}")

    return Hooks(
        ignore_collect, collect_file, collection_modifyitems, runtest_makereport, terminal_summary
    )
