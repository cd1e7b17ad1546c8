"""The top layer's pages: composite views that show several apps at once (may import every app)."""
