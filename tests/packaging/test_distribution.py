"""The wheel and the image context contain the product only (issue 11).

The wheel is built for real from this checkout (``pip wheel``, no network: the build
backend comes from the test environment); the image context is what Docker sends under
the repository's ``.dockerignore``, computed here from the ignore file's rules (the
allow-list kind Docker documents: ``*`` then ``!path`` exceptions) without an engine;
tests/image lists the context buildah really sends.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: What the image holds (the scraper and the library it shares with training code).
PRODUCT = ("exporter_lib", "scraper")
#: Files the image context holds besides the product packages.
CONTEXT_FILES = ("pyproject.toml", "README.md", "constraints.txt")
#: What the wheel holds: the product plus the client (kubectl plugin, notebook helpers).
WHEEL_PACKAGES = (*PRODUCT, "trainjob_client")
DEV_ONLY_REQUIREMENTS = ("cryptography", "rich", "numpy")



@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-q", "-w", str(out), str(REPO)],
                   check=True, timeout=300)
    (path,) = out.glob("trainjob_progress-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_holds_only_the_product_packages(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/", 1)[0] for name in wheel.namelist()}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == set(WHEEL_PACKAGES), sorted(tops)
    assert not [n for n in wheel.namelist() if "localdev" in n or "/demo/" in n
                or "devcluster" in n]


def test_wheel_metadata_keeps_dev_requirements_out_of_the_scraper(
        wheel: zipfile.ZipFile) -> None:
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line.split(":", 1)[1].strip() for line in
                wheel.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    for requirement in requires:
        name = requirement.split(";")[0].strip().lower()
        if name.startswith(DEV_ONLY_REQUIREMENTS):
            assert 'extra == "scraper"' not in requirement, requirement
            assert ";" in requirement, f"{requirement}: a dev requirement must be an extra"
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    scripts = [line.split("=")[0].strip() for line in
               wheel.read(entry_points).decode().splitlines() if "=" in line]
    assert "trainjob-scraper" in scripts
    # kubectl finds plugins by this exact name on PATH.
    assert "kubectl-trainjob" in scripts
    assert not [s for s in scripts if "demo" in s]


def _ignore_rules() -> list[tuple[bool, str]]:
    rules = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    return rules


def _in_context(path: str, rules: list[tuple[bool, str]]) -> bool:
    # Docker: the last matching rule wins; a rule matching a parent directory covers it.
    included = True
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for exception, pattern in rules:
        globbed = pattern.replace("**/", "*/") if pattern.startswith("**/") else pattern
        if any(fnmatch.fnmatchcase(p, globbed) or fnmatch.fnmatchcase(p, pattern.lstrip("*/"))
               for p in prefixes):
            included = exception
    return included


def test_image_context_holds_no_dev_code() -> None:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, check=True, capture_output=True, text=True).stdout.split()
    rules = _ignore_rules()
    context = [f for f in files if _in_context(f, rules)]
    assert context, "the context must hold the product"
    tops = {f.split("/", 1)[0] for f in context}
    assert tops <= {*PRODUCT, *CONTEXT_FILES}, sorted(tops)
    assert any(f.startswith("scraper/") for f in context)
    assert not any(f.startswith(("localdev/", "tests/", "benchmarks/", "tools/")) for f in files
                   if _in_context(f, rules))


def test_dockerfile_copies_only_product_paths() -> None:
    sources: list[str] = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += words[1:-1]
    assert sources
    for source in sources:
        assert source.split("/", 1)[0] in {*PRODUCT, *CONTEXT_FILES}, source


#: Imports each package may not make: dev code everywhere; the client's own display
#: libraries (rich, from the 'client' extra) only outside the scraper and exporter.
FORBIDDEN_IMPORTS = {
    "exporter_lib": ("localdev", "cryptography", "rich", "numpy", "trainjob_client"),
    "scraper": ("localdev", "cryptography", "rich", "numpy"),
    "trainjob_client": ("localdev", "cryptography", "numpy", "scraper"),
}


def test_product_code_never_imports_dev_code() -> None:
    assert set(FORBIDDEN_IMPORTS) == set(WHEEL_PACKAGES)
    for package, forbidden in FORBIDDEN_IMPORTS.items():
        for source in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                for name in names:
                    assert not name.startswith(forbidden), \
                        f"{source.relative_to(REPO)} imports {name}"
