"""Settings read from TRAJLAKE_* variables: JSON objects, empty values, bad values."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from common.settings import Settings


def test_json_object_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJLAKE_KAFKA_EXTRA", '{"fetch.queue.backoff.ms": 100, "security.protocol": "SSL"}')
    monkeypatch.setenv("TRAJLAKE_CATALOG_PROPERTIES", '{"type": "rest"}')
    settings = Settings()
    # librdkafka takes strings: numbers are passed on as text
    assert settings.kafka_extra == {"fetch.queue.backoff.ms": "100", "security.protocol": "SSL"}
    assert settings.catalog_properties == {"type": "rest"}


def test_empty_json_variables_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJLAKE_KAFKA_EXTRA", "")
    monkeypatch.setenv("TRAJLAKE_CATALOG_PROPERTIES", "  ")
    settings = Settings()
    assert settings.kafka_extra == {}
    assert settings.catalog_properties == {}


@pytest.mark.parametrize("value", ["[1, 2]", "{not json", '"text"'])
def test_bad_json_variables_are_refused_with_the_variable_named(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TRAJLAKE_KAFKA_EXTRA", value)
    with pytest.raises(ValidationError, match="kafka_extra"):
        Settings()


def test_consumer_fetch_backoff_depends_on_the_mode_and_extra_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.ingest import consumer_config

    catch_up = consumer_config(Settings(), "127.0.0.1:9092")
    follow = consumer_config(Settings(), "127.0.0.1:9092", follow=True)
    assert catch_up["fetch.queue.backoff.ms"] == 100  # draining a backlog: refetch soon after a full prefetch
    assert "fetch.queue.backoff.ms" not in follow  # tailing next to producers: librdkafka's default
    assert {k: v for k, v in catch_up.items() if k != "fetch.queue.backoff.ms"} == follow
    monkeypatch.setenv("TRAJLAKE_KAFKA_EXTRA", '{"fetch.queue.backoff.ms": 10, "queued.max.messages.kbytes": 4096}')
    for mode in (False, True):
        tuned = consumer_config(Settings(), "127.0.0.1:9092", follow=mode)
        assert tuned["fetch.queue.backoff.ms"] == "10" and tuned["queued.max.messages.kbytes"] == "4096"


# Values a hand or a template can leave in a variable: empty, blank, non-finite, beyond int64, deeper
# JSON than the parser's stack, bytes that are no UTF-8 (surrogate-escaped by os.environ), line breaks.
HOSTILE_VALUES = [
    "",
    " ",
    "nan",
    "inf",
    "-1",
    "1e400",
    "x",
    "[",
    "[NaN, 0, 0]",
    "[Infinity, 0, 0]",
    "[" * 10_000,
    '{"a":' * 10_000,
    "9" * 5000,
    "\udcff\udcfe",
    "a\nb",
    '{"edited_tests": {"weight": NaN}}',
]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_every_variable_with_a_hostile_value_loads_or_is_one_named_config_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from common.errors import ConfigError
    from common.settings import load_settings

    for name in Settings.model_fields:
        variable = f"TRAJLAKE_{name.upper()}"
        monkeypatch.setenv(variable, value)
        try:
            settings = load_settings()
        except ConfigError as exc:
            assert variable in str(exc) and "\n" not in str(exc), str(exc)
        else:  # what loads is a value a setting may have: never NaN or infinite
            loaded = getattr(settings, name)
            numbers = loaded if isinstance(loaded, tuple) else (loaded,)
            assert all(not isinstance(n, float) or math.isfinite(n) for n in numbers), (variable, loaded)
        monkeypatch.delenv(variable)


def test_quality_weights_of_nan_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from common.errors import ConfigError
    from common.settings import load_settings

    monkeypatch.setenv("TRAJLAKE_QUALITY_WEIGHTS", "[NaN, 0.5, 0.5]")
    with pytest.raises(ConfigError, match="TRAJLAKE_QUALITY_WEIGHTS"):
        load_settings()
