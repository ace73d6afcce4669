"""Op records, one module per area; each module defines ``RECORDS``."""
