"""How machina reads and writes files: nothing half-written (``atomic``), damage detected (``checksum``), and
every file read back treated as data (``torch_file``, ``stored_config``, ``saved_state``, ``metrics_file``,
``snapshot``). The bottom layer: it imports nothing of machina but ``keys`` and ``errors``."""
