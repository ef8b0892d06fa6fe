"""Dagster definitions: thin wrappers over the trajlake packages."""
