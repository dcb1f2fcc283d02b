"""``agent compare``: the closed-loop comparison of temporal cores (cells in :mod:`.cells`, the
tables and figure in :mod:`.report`)."""
