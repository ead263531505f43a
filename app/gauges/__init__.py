"""Device gauges: each source returns numbers or None ("not present"); no Qt here."""
