"""What moves and reshapes data: ingest, assembly, scoring, export."""
