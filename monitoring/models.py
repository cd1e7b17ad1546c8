"""Monitoring models."""
