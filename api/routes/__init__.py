"""One router per resource; ``api.main`` mounts them."""
