"""The ingest profile's stage table: py-spy raw stacks put in stages and laid over measured CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.ingest_ab import classify, stage_table

WORKER = 'process 10:"python -P benchmarks/ingest_child.py ingest 1.0"'
# the decoder's command line holds a ";", which py-spy writes as it is
DECODER = (
    f'{WORKER};process 11:"python -B -P -c from multiprocessing.spawn import spawn_main;'
    ' spawn_main(tracker_fd=7, pipe_handle=9) --multiprocessing-fork"'
)


def _stack(process: str, *frames: str) -> list[str]:
    return [*process.split(";"), "thread (0x1)", *frames]


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        (
            _stack(WORKER, "run (pipelines/ingest/worker.py:406)", "_run (pipelines/ingest/worker.py:417)"),
            ("worker", "poll"),
        ),
        (
            _stack(WORKER, "_run (pipelines/ingest/worker.py:418)", "add (pipelines/ingest/batch.py:70)"),
            ("worker", "framing"),
        ),
        (
            _stack(WORKER, "_process (pipelines/ingest/worker.py:300)", "commit_rows (pipelines/ingest/commit.py:214)"),
            ("worker", "commit"),
        ),
        (_stack(WORKER, "__init__ (pipelines/ingest/worker.py:88)", "open_catalog (x.py:1)"), ("worker", "set-up")),
        (_stack(WORKER, "_worker (concurrent/futures/thread.py:81)"), ("worker", "waiting")),
        (
            _stack(DECODER, "handle (pipelines/decode/server.py:70)", "read_container (pipelines/decode/framing.py:9)"),
            ("decoder", "decode"),
        ),
        (
            _stack(
                DECODER, "decode_here (pipelines/decode/batch.py:250)", "_to_columns (pipelines/decode/batch.py:80)"
            ),
            ("decoder", "Arrow building"),
        ),
        # pyiceberg writes on its own executor thread: no frame of ours on the stack
        (
            _stack(DECODER, "write_file.<locals>.write_data_file (pyiceberg/io/pyarrow.py:2757)"),
            ("decoder", "Parquet encoding"),
        ),
        (_stack(DECODER, "_warm_up (pipelines/decode/server.py:85)"), ("decoder", "set-up")),
    ],
)
def test_a_stack_goes_to_the_stage_of_its_innermost_named_frame(stack: list[str], expected: tuple[str, str]) -> None:
    assert classify(stack) == expected


def test_the_table_lays_sample_shares_over_the_measured_cpu(tmp_path: Path) -> None:
    raw = tmp_path / "stacks.txt"
    poll = ";".join(_stack(WORKER, "_run (pipelines/ingest/worker.py:417)"))
    commit = ";".join(_stack(WORKER, "_process (pipelines/ingest/worker.py:300)"))
    decode = ";".join(_stack(DECODER, "read_container (pipelines/decode/framing.py:9)"))
    parquet = ";".join(_stack(DECODER, "write_files (pipelines/decode/files.py:40)"))
    setup = ";".join(_stack(WORKER, "_find_and_load (<frozen importlib._bootstrap>:1176)"))
    raw.write_text(f"{poll} 30\n{commit} 10\n{decode} 25\n{parquet} 75\n{setup} 999\n")
    rows = {
        stage: (worker, decoder)
        for stage, worker, decoder in stage_table(raw, 1000, {"worker": 5.0, "decoder": 8.0, "kafka_threads": 1.0})
    }
    assert rows["poll: librdkafka's threads"] == (1.0, 0.0)
    # the worker's 4 µs left after librdkafka's threads, 3:1; the decoder's 8 µs, 1:3; set-up left out
    assert rows["poll: Python (consume, Message objects)"][0] == pytest.approx(3.0)
    assert rows["commit"][0] == pytest.approx(1.0)
    assert rows["decode"][1] == pytest.approx(2.0)
    assert rows["Parquet encoding"][1] == pytest.approx(6.0)
    assert sum(w for w, _ in rows.values()) == pytest.approx(5.0)
    assert sum(d for _, d in rows.values()) == pytest.approx(8.0)
