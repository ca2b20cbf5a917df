"""The PySpark usage pipeline over the gateway's usage files (docs/usage.md).

Pure DataFrame transforms in :mod:`spark.transforms`, file I/O at the edges in
:mod:`spark.io`, the report job in :mod:`spark.report` and its command line
(``pushgate usage report``) in :mod:`spark.cli`. Imports nothing from the gateway: the
usage file format is a contract, kept in :mod:`spark.schema`.
"""
