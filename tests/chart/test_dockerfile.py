"""The scraper's Dockerfile agrees with the chart (tests/image builds and runs it).

Checked statically, so these hold for any base passed as PYTHON_IMAGE: multi-stage,
the default base pinned to an exact Python patch release, a numeric non-root user
equal to the chart's runAsUser, the chart's metrics port exposed, and
`trainjob-scraper run` as the command the chart's args assume.
"""

from __future__ import annotations

import re

import yaml

from tests.helpers.chart import CHART, REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def _instructions(name: str) -> list[str]:
    return [line.split(None, 1)[1].strip() for line in DOCKERFILE.splitlines()
            if line.split(None, 1)[:1] == [name]]


def test_multi_stage_with_a_pinned_base() -> None:
    stages = _instructions("FROM")
    assert len(stages) >= 2, "builder and runtime stages"
    (base,) = {re.sub(r" AS \w+$", "", s, flags=re.IGNORECASE) for s in stages}
    assert base == "${PYTHON_IMAGE}"
    (arg,) = [a for a in _instructions("ARG") if a.startswith("PYTHON_IMAGE=")]
    # an exact patch release and Debian release, never a floating tag such as "3.11-slim"
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.1[1-9]\.\d+-slim-(bookworm|trixie)"
                        r"(@sha256:[0-9a-f]{64})?", arg), arg
    assert "COPY --from=builder /opt/venv /opt/venv" in DOCKERFILE


def test_runs_as_the_chart_non_root_user() -> None:
    users = _instructions("USER")
    assert users, "the runtime stage must set USER"
    uid, gid = users[-1].split(":")
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can verify it
    assert int(uid) == VALUES["podSecurityContext"]["runAsUser"]
    assert int(gid) == VALUES["podSecurityContext"]["runAsGroup"]


def test_entrypoint_port_and_command_match_the_chart() -> None:
    assert _instructions("EXPOSE") == [str(VALUES["metrics"]["port"])]
    assert _instructions("ENTRYPOINT") == ['["trainjob-scraper"]']
    assert _instructions("CMD") == ['["run"]']
    # the chart's args start with the subcommand and override CMD entirely
    assert "- run" in (CHART / "templates" / "_helpers.tpl").read_text()
