"""Settings read from TRAJLAKE_* variables: JSON objects, empty values, bad values."""

from __future__ import annotations

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
