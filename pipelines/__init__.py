"""What moves and reshapes data: broker, ingest, assembly, export and the CLI."""
