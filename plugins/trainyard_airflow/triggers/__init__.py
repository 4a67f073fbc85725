"""Triggers (run in the triggerer). Import from their modules; they import the cncf.kubernetes provider."""
