"""audits."""
