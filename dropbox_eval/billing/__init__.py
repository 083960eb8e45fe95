"""billing."""
