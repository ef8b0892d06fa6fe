"""What emits events: the producer SDK, the sandbox fleet and importers."""
