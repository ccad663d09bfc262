"""A SparkSession for the gateway source: local Spark by default, settings safe for small machines."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

# Local-mode defaults (a laptop or a 2-core CI box); --conf / `conf` override them.
LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}


def under_spark_submit() -> bool:
    """True when this driver was started by spark-submit (which then decides master and conf)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def register(spark: SparkSession) -> SparkSession:
    """Register the `gateway` data source with `spark`."""
    from .source import GatewayDataSource

    spark.dataSource.register(GatewayDataSource)
    return spark


def spark_session(
    app_name: str = "gateway-analytics", master: str | None = None, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """The active SparkSession (spark-submit, a notebook) or a new one on `master` (default
    `local[*]`), with the gateway source registered. Spark's Python workers run this interpreter
    unless PYSPARK_PYTHON says otherwise (otherwise they might start a python3 without pyarrow)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None:
        return register(active)
    builder = SparkSession.builder.appName(app_name)
    if not under_spark_submit():
        master = master or "local[*]"
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.master(master)
        for k, v in LOCAL_CONF.items():
            builder = builder.config(k, v)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    return register(spark)
