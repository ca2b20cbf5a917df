"""The PySpark usage pipeline over the gateway's usage files. Not built yet."""
