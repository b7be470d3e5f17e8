"""The inference engine: batching and model runners, usable without HTTP."""
