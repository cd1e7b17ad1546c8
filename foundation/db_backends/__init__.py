"""The portal's own database backends: Django's, with what the portal changes (see each one)."""
