"""An OpenAI-compatible server over the framework's sessions (`framework serve`).

models.py   -m names to files, loading, reservation of every model and session together, warm-up
pool.py     a model's parallel sessions and the bounded queue in front of them
engine.py   the compute thread every step goes through, and one request's generation
stops.py    stop strings cut out of text that arrives a token at a time
schemas.py  request bodies, checked strictly: every field honoured or refused by name
structured.py  JSON schemas and GBNF grammars as a token mask (llguidance)
logprobs.py log-probabilities in OpenAI's two shapes
metrics.py  /metrics (prometheus_client) and the access log
guard.py    the Host and Origin checks, CORS only for --cors
shutdown.py SIGINT/SIGTERM: refuse new requests, let running ones finish, then cut them in words
app.py      the routes, keys, body limit and OpenAI-style errors
server.py   start-up order and uvicorn
"""

from .app import Settings, create_app
from .models import ServedModel, load_models

__all__ = ["Settings", "create_app", "ServedModel", "load_models"]
