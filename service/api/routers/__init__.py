"""One APIRouter per concern: probes and info, embedding, the compatible APIs, preprocessing, extraction."""
