"""Settings split by environment: base, local (make run), test (make test), production."""
