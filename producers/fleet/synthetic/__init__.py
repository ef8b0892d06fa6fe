"""The synthetic fleet: reference-scale traffic (``traffic``) and its hand-written Avro encoder (``encoder``)."""

from __future__ import annotations

from producers.fleet.synthetic.encoder import (
    ENVELOPE,
    FIELDS,
    SOURCES,
    WRITER_VERSION,
    FastEncoder,
    SessionHeader,
    SynthEvent,
    avro_map,
    avro_opt_str,
    avro_str,
    to_dict,
    ts_varint,
    varint,
)
from producers.fleet.synthetic.session import TrafficProfile
from producers.fleet.synthetic.traffic import MAX_TEMPLATES, WARM_TEMPLATES, SyntheticFleet

__all__ = [
    "ENVELOPE",
    "FIELDS",
    "MAX_TEMPLATES",
    "SOURCES",
    "WARM_TEMPLATES",
    "WRITER_VERSION",
    "FastEncoder",
    "SessionHeader",
    "SynthEvent",
    "SyntheticFleet",
    "TrafficProfile",
    "avro_map",
    "avro_opt_str",
    "avro_str",
    "to_dict",
    "ts_varint",
    "varint",
]
