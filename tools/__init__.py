"""Developer scripts (not installed): run each as `python -m tools.<name>` from the repository root."""
