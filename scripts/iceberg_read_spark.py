"""Read Iceberg tables with Apache Spark and the Iceberg Spark runtime: the "other engine" check.

Runs in a separate virtual environment holding pyspark; the Iceberg runtime jar
(``org.apache.iceberg:iceberg-spark-runtime-3.5_2.12`` from Maven Central) is passed
as ``--jar``. Tables load by metadata file, so no catalog service is needed.

Input (stdin): JSON ``{"key": {"metadata": "<metadata.json URI>", "select": "<SQL select list>"}}``.
Output (stdout, last line): JSON ``{"key": [values of the select list]}``.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import SparkSession


def main() -> None:
    """Answer the request on stdin with one local Spark session."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jar", required=True, help="iceberg-spark-runtime jar")
    args = parser.parse_args()
    request = json.load(sys.stdin)
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("trajlake-iceberg-check")
        .config("spark.jars", args.jar)
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    answer = {}
    try:
        for key, spec in request.items():
            spark.read.format("iceberg").load(spec["metadata"]).createOrReplaceTempView("t")
            row = spark.sql(f"SELECT {spec['select']} FROM t").collect()[0]
            answer[key] = [None if v is None else str(v) for v in row]
    finally:
        spark.stop()
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
