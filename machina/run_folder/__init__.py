"""A run folder's life: one writer at a time (``run_lock``), its record written only once the run is accepted
(``run_record``), an append-only history and where a start continues from (``history``), and finished runs read back
for compare and plot (``reading``)."""
