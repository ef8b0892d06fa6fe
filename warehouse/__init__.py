"""The Iceberg catalog, table definitions, tiering, maintenance and the DuckDB SQL layer."""
