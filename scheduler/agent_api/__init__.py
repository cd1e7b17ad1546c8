"""The HTTP API node agents speak: each request is authenticated by a per-node token and can
touch nothing but that node and the work assigned to it."""
