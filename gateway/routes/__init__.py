"""HTTP routes, one module per resource; each exposes a class with ``routes()``."""
