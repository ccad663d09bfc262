"""Column helpers for telemetry read with the gateway source."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType


def parse_json_body(
    df: DataFrame, schema: StructType | str, body: str = "body", prefix: str = ""
) -> DataFrame:
    """`df` with the fields of its JSON `body` as columns (named `prefix` + field), parsed with
    `schema` (a StructType or DDL like "ts double, temp double"). A body that is not a JSON object
    gives nulls; the other columns are kept."""
    parsed = F.from_json(F.col(body).cast("string"), schema)
    tmp = "__json_body"
    out = df.withColumn(tmp, parsed)
    names = out.select(f"{tmp}.*").columns
    return out.select(
        *[F.col(c) for c in df.columns], *[F.col(f"{tmp}.{n}").alias(prefix + n) for n in names]
    )


def device_id(path: str | Column = "path", level: int = 1) -> Column:
    """Level `level` (0-based) of the topic path: `devices/42/telemetry` -> "42" with level 1.
    Null when the path has fewer levels or that level is empty."""
    col = F.col(path) if isinstance(path, str) else path
    part = F.element_at(F.split(col, "/"), level + 1)
    return F.when(F.size(F.split(col, "/")) > level, F.nullif(part, F.lit(""))).otherwise(F.lit(None))


def event_time(value: str | Column, fallback: str | Column | None = "born_timestamp") -> Column:
    """A timestamp from a JSON time field: epoch seconds (milliseconds when above 1e11) as a number
    or numeric string, or an ISO 8601 string; `fallback` (a timestamp column) when missing."""
    v = F.col(value) if isinstance(value, str) else value
    s = v.cast("string")
    num = s.try_cast("double") if hasattr(s, "try_cast") else s.cast("double")
    from_num = F.when(num > 1e11, F.timestamp_millis(num.cast("long"))).otherwise(F.timestamp_seconds(num))
    ts = F.coalesce(from_num, F.try_to_timestamp(s))
    if fallback is not None:
        ts = F.coalesce(ts, F.col(fallback) if isinstance(fallback, str) else fallback)
    return ts
