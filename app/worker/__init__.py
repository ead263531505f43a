"""The engine worker process and the GUI's async channel to it."""
