"""The HTTP layer: FastAPI routers, schemas, errors, auth and metrics."""
