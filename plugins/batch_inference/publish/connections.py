"""An Airflow connection id to the DSN of a :class:`~batch_inference.publish.target.PublishTarget`.

The one module of ``batch_inference.publish`` that uses Airflow, imported only by the Airflow side (the
rest of the package never imports Airflow). The connection's type is checked before its URI is built:
a connection of another type (``http``, ``google_cloud_platform``, ...) never reaches psycopg, which
would echo the whole URI, password included, in its error. No message here holds a URI or password.
"""

from __future__ import annotations

from batch_inference.publish.errors import PublishConnectionError

POSTGRES_CONN_TYPES = ("postgres", "postgresql")
"""Airflow ``conn_type`` values accepted for a PostgreSQL publish target or Iceberg catalog."""


class ConnectionTypeError(PublishConnectionError):
    """The Airflow connection is not a PostgreSQL one (message: connection id and type only).

    Attributes:
        conn_id: the Airflow connection id.
        conn_type: its type, as Airflow reports it.
    """

    def __init__(self, field: str, conn_id: str, conn_type: str) -> None:
        shown = conn_type if len(conn_type) <= 40 else conn_type[:40] + "..."
        super().__init__(f"params.{field}: Airflow connection {conn_id!r} is of type {shown!r}, not one of "
                         f"{', '.join(POSTGRES_CONN_TYPES)}; publish connects only to PostgreSQL connections")
        self.conn_id = conn_id
        self.conn_type = conn_type


def airflow_postgres_dsn(conn_id: str, *, field: str = "postgres_conn_id") -> str:
    """The ``postgresql://`` URI of Airflow connection ``conn_id``, once its type is a PostgreSQL one.

    Args:
        conn_id: Airflow connection id (``AIRFLOW_CONN_<ID>``, the metadata database or a secrets backend).
        field: the run parameter that named it (``postgres_conn_id``, ``iceberg_catalog_conn_id``), for
            messages.

    Returns:
        The URI, ``postgres://`` rewritten as ``postgresql://`` (a secret: keep it out of logs, XComs and
        argv; pass it on only inside a ``PublishTarget``, whose ``repr`` leaves it out).

    Raises:
        PublishConnectionError: no connection ``conn_id`` exists.
        ConnectionTypeError: its ``conn_type`` is not in :data:`POSTGRES_CONN_TYPES`.
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        conn = None
    if conn is None:
        raise PublishConnectionError(f"params.{field}: Airflow connection {conn_id!r} does not exist; create it "
                                     "(AIRFLOW_CONN_<ID>=postgresql://...) or pick another")
    conn_type = str(conn.conn_type or "")
    if conn_type.lower() not in POSTGRES_CONN_TYPES:
        raise ConnectionTypeError(field, conn_id, conn_type)
    uri = conn.get_uri()
    scheme, sep, rest = uri.partition("://")
    return f"postgresql://{rest}" if sep and scheme.lower() in POSTGRES_CONN_TYPES else uri
