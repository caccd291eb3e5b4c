"""The ``--config`` file as a settings source, and the options of earlier releases.

The file is YAML (JSON is YAML); its keys are option names with ``_`` or ``-``.  A key
given twice, an unknown key or a removed option is refused, all at once, each naming
the file and the key (:class:`~scraper.shared.errors.ConfigError`).
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from scraper.shared.errors import ConfigError

__all__ = ["REMOVED_OPTIONS", "FileSource", "file_keys_given", "removed_option"]


#: Options of earlier releases, by field name, each with what replaced it: given as a
#: flag, an environment variable or a config-file key, it is refused with the way
#: forward (argparse would say "unrecognized arguments", and pydantic-settings ignores
#: an environment variable it has no field for).
REMOVED_OPTIONS = {
    "metrics_write_interval": "replaced by metrics-staleness (how long a change of "
                              "metrics or ETA alone may wait) and progress-floor "
                              "(least time between two writes of one TrainJob)",
}


def removed_option(name: str) -> str | None:
    """What replaced option ``name`` (flag, file key or field spelling), or None."""
    return REMOVED_OPTIONS.get(name.lstrip("-").replace("-", "_").lower())


#: The options the config file gave, by field, as the file spells each key (to name the
#: file in an error about its value).
file_keys_given: ContextVar[dict[str, str]] = ContextVar("trainjob_scraper_file_keys")


class _KeyTwice(yaml.YAMLError):
    """A mapping of the config file has the same key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping: ``safe_load``
    keeps the last silently, so ``write-qps: 2`` then ``write-qps: 5`` would say 5.
    A merge key (``<<: *defaults``) still works as in ``safe_load``: the mapping's own
    keys override the merged ones (YAML's merge-key type)."""


def _unique_keys(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue  # merged keys may be overridden here: construct_mapping merges them
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        if isinstance(key, str | int | float | bool) and key in seen:
            raise _KeyTwice(f"option {key!r} given twice (lines {seen[key]} and {line})")
        if isinstance(key, str | int | float | bool):
            seen[key] = line
    return loader.construct_mapping(node)


_MERGE_TAG = "tag:yaml.org,2002:merge"
_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys)


class FileSource(PydanticBaseSettingsSource):
    """Values from the ``--config`` YAML/JSON file (JSON is YAML)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns everything at once

    def __call__(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            data = yaml.load(self.path.read_text(), Loader=_UniqueKeyLoader)
        except _KeyTwice as exc:
            raise ConfigError([f"config={str(self.path)!r}: {exc}"]) from None
        except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: not UTF-8
            raise ConfigError([f"config={str(self.path)!r}: cannot read ({exc})"]) from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigError([f"config={str(self.path)!r}: expected a mapping of options"])
        fields = self.settings_cls.model_fields
        out: dict[str, Any] = {}
        seen: dict[str, Any] = {}  # field -> the key as the file spells it
        problems = []
        for raw_key, value in data.items():
            key = str(raw_key).replace("-", "_")
            if key in out:  # write-qps and write_qps: which one was meant is unknown
                problems.append(f"config={str(self.path)!r}: option {raw_key!r} given twice "
                                f"(also as {seen[key]!r})")
                continue
            if key in fields:
                out[key] = value
                seen[key] = raw_key
                continue
            hint = removed_option(key)
            problems.append(f"config={str(self.path)!r}: "
                            + (f"option {raw_key!r} was removed: {hint}" if hint
                               else f"unknown option {raw_key!r}"))
        if problems:  # every bad key at once, not one per try
            raise ConfigError(problems)
        file_keys_given.get({}).update({key: str(seen[key]) for key in out})
        return out
